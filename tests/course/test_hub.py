"""A real classroom server, rehearsed: JupyterHub from PyPI, configurable-http-proxy
from npm, K system users served by LocalProcessSpawner, all running lab 03 at the
same moment through their servers' kernel APIs (env/jupyterhub/rehearse.py).

CI runs K = 2 (LABKIT_HUB_LEARNERS): the same code path as a full rehearsal, two
learners at once being the least that shows one learner not touching another's
files, ports or temp folders, in about 6 minutes of CI's 40 (INSTRUCTORS.md,
"Sizing a room, from a rehearsal"). K = 8 took 164 s per learner on this machine
alone and 805 s beside other work, which does not fit: `sudo make rehearse-hub K=8`
(or K=16, which this machine's memory does not hold) is the full one, run by hand.

Needs root, npm and a system Python of the course's version (the learners cannot run
one under /root): elsewhere it skips, saying why; with LABKIT_REQUIRE_CLUSTER=1 (CI,
as root) a skip is a failure. One rehearsal serves every test below.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REHEARSE = ROOT / "env" / "jupyterhub" / "rehearse.py"
REQUIRE = os.environ.get("LABKIT_REQUIRE_CLUSTER") == "1"
LEARNERS = int(os.environ.get("LABKIT_HUB_LEARNERS", "2"))
# An idle learner (server + kernel after the lab, the launcher's helper gone), PSS:
# 0.55-0.6 GiB measured here; the bound leaves room for another torch build.
IDLE_PSS_MIB = 700


def _unavailable() -> str:
    """Why the rehearsal cannot run here, or ""."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if os.geteuid() != 0:
        return "needs root (it creates system users and spawns servers as them)"
    if shutil.which("npm") is None:
        return "needs npm (configurable-http-proxy comes from npm)"
    if not Path(f"/usr/bin/python{version}").exists():
        return f"needs /usr/bin/python{version} (a Python every learner can run)"
    return ""


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """Run the rehearsal once (about 6 minutes on 2 cores at K = 2); return its
    report."""
    reason = _unavailable()
    if reason:
        (pytest.fail if REQUIRE else pytest.skip)(f"JupyterHub rehearsal {reason}")
    report = tmp_path_factory.mktemp("hub") / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["LABKIT_HUB_USERS"] = f"lkt{os.getpid()}u"   # users of this run only
    done = subprocess.run(
        [sys.executable, str(REHEARSE), "--learners", str(LEARNERS), "--idle-s", "20",
         "--report", str(report)], capture_output=True, text=True,
        timeout=600 + 300 * LEARNERS,
        env=env)
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(report.read_text()), done.stdout


def test_every_learner_finishes_lab03_without_an_error_cell(rehearsal):
    """Did every learner run lab 03 to its end, every check passed or taken?"""
    report, out = rehearsal
    errors = {name: r["errors"] for name, r in report["learners"].items() if r["errors"]}
    assert not errors, out
    assert report["summary"]["finished"] == LEARNERS


def test_nothing_of_a_learner_listens_beyond_loopback(rehearsal):
    """Did every socket labkit or a kernel opened listen on loopback only (the
    learners' own `!torchrun` cells excepted: lab 03 says they cannot be bound)?"""
    report, out = rehearsal
    assert report["listeners"] > 0, "no listening socket seen: the watcher is blind"
    assert report["summary"]["exposed_by_labkit"] == [], out


def test_no_learner_can_touch_another_learners_files(rehearsal):
    """Are homes and temp folders private, and the course and data read-only?"""
    report, out = rehearsal
    assert report["isolation"] == [], out


def test_each_learner_keeps_to_their_own_temp_folder(rehearsal):
    """Did each learner put nothing in /tmp but their own course-<name> folder (the
    TMPDIR the hub gave them, 0700)?"""
    report, _out = rehearsal
    assert report["tmp_seen"] == {name: [f"course-{name}"]
                                  for name in report["learners"]}


def test_nothing_is_left_once_the_servers_stop(rehearsal):
    """After the servers stop: no learner process, no learner file in /tmp, /var/tmp
    or /dev/shm?"""
    report, out = rehearsal
    assert report["leftovers"] == {}, out


def test_an_idle_learner_holds_little_memory(rehearsal):
    """With the lab done and the launcher's helper gone, does each learner hold less
    than IDLE_PSS_MIB (their processes' PSS)?"""
    report, out = rehearsal
    assert report["summary"]["idle_pss_mib_max"] < IDLE_PSS_MIB, out


def test_the_report_says_the_verdict(rehearsal):
    """Does the rehearsal's own verdict agree (its exit code is what make uses)?"""
    report, out = rehearsal
    assert report["ok"], out


class _FakeKernelSocket:
    """A kernel websocket that answers nothing but what the server said meanwhile."""

    def __init__(self, messages):
        self.messages = [json.dumps(m) for m in messages]

    def send(self, text):
        pass

    def settimeout(self, seconds):
        pass

    def recv(self):
        if not self.messages:
            raise AssertionError("the client read past the kernel's death")
        return self.messages.pop(0)


def test_a_cell_whose_kernel_died_ends_at_once_saying_so():
    """When the server restarts a killed kernel (out of memory, as at K = 16), the
    request that was running has no reply ever: the rehearsal's cell must end on the
    server's status message, not wait out its 900 s."""
    # env/jupyterhub's client, by its path (rehearse.py puts its folder on sys.path)
    spec = importlib.util.spec_from_file_location("hub_client",
                                                  REHEARSE.parent / "hub_client.py")
    hub_client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hub_client)
    restarting = {"msg_type": "status", "parent_header": {}, "channel": "iopub",
                  "content": {"execution_state": "restarting"}}
    other = {"msg_type": "stream", "parent_header": {"msg_id": "someone else's"},
             "content": {"name": "stdout", "text": "not ours"}}
    session = hub_client.KernelSession(hub=None, name="learner", path="lab.ipynb")
    session.socket = _FakeKernelSocket([other, restarting])
    cell = session.run(3, "1 + 1", timeout=900)
    assert cell.error == hub_client.KERNEL_DIED and cell.seconds < 60
    assert not hub_client.kernel_died({"msg_type": "status", "parent_header": {},
                                       "content": {"execution_state": "idle"}})
