"""Rehearse a classroom on this machine: K learners on a real JupyterHub, all running
one lab at the same moment through their servers' kernel APIs. Run as root.

    sudo .venv/bin/python env/jupyterhub/rehearse.py --learners 8
    make rehearse-hub K=16

Set up as The Littlest JupyterHub does on one machine, minus systemd: JupyterHub
(PyPI, env/jupyterhub/requirements-hub.txt) and configurable-http-proxy (npm), both
into build/hub/; a hub on 127.0.0.1; one system user per learner (removed at the
end, home 0700) and LocalProcessSpawner, each server running as its learner;
env/jupyterhub/tljh_course.py loaded unchanged. The course is installed where
learners can read it (hub_install.py): labkit not editable, labs/ copied to each
learner's ~/course/labs, MNIST shared read-only.

Each learner opens ~/course/labs/<lab> in quick mode and runs it cell by cell as a
stuck learner would: every check fails on the stub, the learner takes the reference
line it ends with, and the lab goes on. Recorded: each learner's time and error
cells, peak and idle memory (idle: the kernel still up, a minute after the lab, when
the launcher's helper has gone), the machine's load and free memory; whether one
learner can touch another's files, sockets beyond loopback, and what is left once
the servers stop. Prints a table, writes build/hub/report-K<K>.json, and exits 1
on any error cell, exposure, isolation problem or leftover.
"""

import argparse
import json
import os
import pwd
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import hub_install  # noqa: E402  (this folder's modules, after the path is set)
import room_audit  # noqa: E402
from hub_client import Hub, KernelSession  # noqa: E402

ROOT = HERE.parents[1]
PREFIX = "lkr"   # the rehearsal's system users: lkr01, lkr02, ...

TAKE_THE_REFERENCE = '''from labkit.checks import ExerciseFailed as _ExerciseFailed
import re as _re
_check = {source!r}
try:
    exec(_check)
except _ExerciseFailed as _failed:
    _line = _re.search(r"`(checks\\.use_reference\\([^`]*\\))`$", str(_failed).strip())
    if not _line:
        raise
    exec(_line.group(1))
    exec(_check)
'''


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------- users and hub

def make_users(count: int) -> list:
    """Create ``count`` system users with private homes; return their pwd entries."""
    accounts = []
    for index in range(1, count + 1):
        name = f"{PREFIX}{index:02d}"
        remove_user(name)   # left by an interrupted rehearsal
        subprocess.run(["useradd", "--create-home", "--user-group", "--shell",
                        "/bin/bash", "--key", "HOME_MODE=0700", name], check=True)
        accounts.append(pwd.getpwnam(name))
    return accounts


def remove_user(name: str) -> None:
    subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
    subprocess.run(["userdel", "--remove", name], capture_output=True)


_CONFIG = '''
c = get_config()  # noqa: F821
c.JupyterHub.bind_url = "http://127.0.0.1:{public}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{state}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{state}/cookie_secret"
c.JupyterHub.pid_file = "{state}/jupyterhub.pid"
c.ConfigurableHTTPProxy.pid_file = "{state}/proxy.pid"
c.JupyterHub.cleanup_servers = True
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.disable_user_config = True
c.Spawner.start_timeout = 600
c.Spawner.http_timeout = 600
c.Spawner.environment = {environment!r}
c.JupyterHub.services = [{{"name": "rehearsal", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "rehearsal", "services": ["rehearsal"],
    "scopes": ["admin:users", "admin:servers", "access:servers", "list:users"]}}]
load_subconfig({course_config!r})   # the course's hub settings, unchanged
'''


@contextmanager
def running_hub(install: "hub_install.Install", environment: dict):
    """Start JupyterHub (and its proxy) on loopback; yield a Hub; stop it after."""
    state = install.build / "state"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(mode=0o700, parents=True)
    token, public = secrets.token_hex(32), _free_port()
    (state / "jupyterhub_config.py").write_text(_CONFIG.format(
        public=public, hub=_free_port(), api=_free_port(), proxy=str(install.proxy),
        state=state, singleuser=str(install.bin / "jupyterhub-singleuser"),
        environment=environment, token=token,
        course_config=str(HERE / "tljh_course.py")))
    env = {"PATH": f"{install.bin}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "HOME": str(state), "COURSE_HOME": str(install.course),
           "COURSE_DATA": str(install.data)}   # no PYTHONPATH: learners get none
    log = open(state / "hub.log", "w")
    hub = subprocess.Popen([str(install.bin / "jupyterhub"), "-f",
                            str(state / "jupyterhub_config.py")], cwd=state, env=env,
                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = Hub(f"http://127.0.0.1:{public}", token)
        client.wait_up()
        yield client
    finally:
        hub.terminate()   # cleanup_servers: the hub stops every server first
        try:
            hub.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, 9)
            hub.wait()
        log.close()


def _wait(check, names: list, limit: float) -> float:
    """Wait until ``check(name)`` holds for every name; return the seconds taken."""
    start, left = time.monotonic(), set(names)
    while left:
        if time.monotonic() - start > limit:
            raise TimeoutError(f"not ready after {limit:g} s: {sorted(left)}")
        left = {name for name in left if not check(name)}
        time.sleep(1.0)
    return time.monotonic() - start


# ---------------------------------------------------------------- one learner

def learner_cells(notebook: dict, checks: set) -> list:
    """(index, code) of each code cell; check cells take the reference when stuck."""
    cells = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) \
            else cell["source"]
        if index in checks:
            source = TAKE_THE_REFERENCE.format(source=source)
        cells.append((index, source))
    return cells


def run_learner(hub: Hub, name: str, lab: str, checks: set, start: threading.Barrier,
                timeout: float, result: dict) -> None:
    """Open the learner's copy of ``lab`` and run it; fill ``result``."""
    session = KernelSession(hub, name, f"course/labs/{lab}")
    errors = []
    try:
        start.wait()
        began = time.monotonic()
        session.open()
        result["kernel_s"] = round(time.monotonic() - began, 1)
        for index, code in learner_cells(session.notebook(), checks):
            cell = session.run(index, code, timeout)
            if cell.error:
                errors.append({"cell": index, "error": cell.error,
                               "output": cell.text[-1500:]})
        result["seconds"] = round(time.monotonic() - began, 1)
    except Exception as err:   # the learner's browser would show it: record it
        errors.append({"cell": None, "error": f"{type(err).__name__}: {err}"})
    result["errors"], result["session"] = errors, session
    result["reconnects"] = session.reconnects


# ---------------------------------------------------------------- the rehearsal

def rehearse(hub: Hub, accounts: list, options) -> dict:
    """Start every server, run the lab in all at once, measure, stop; return a report."""
    names = [a.pw_name for a in accounts]
    uids = {a.pw_name: a.pw_uid for a in accounts}
    hub.api("POST", "users", json={"usernames": names})
    for name in names:
        hub.start_server(name)
    report = {"servers_ready_s": round(_wait(hub.server_ready, names, 900), 1)}
    watcher = room_audit.Watcher(uids)
    watcher.start()
    report["server_only_mib"] = room_audit.memory_of(uids)
    report["isolation"] = room_audit.isolation_problems(
        accounts, [str(hub_install.BUILD / "course"), str(hub_install.BUILD / "mnist")])
    results = {name: {} for name in names}
    checks = hub_install.check_cells(options.lab)
    start = threading.Barrier(len(names))
    threads = [threading.Thread(target=run_learner, args=(
        hub, name, options.lab, checks, start, options.cell_timeout, results[name]))
        for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(options.idle_s + 15)   # the helper stops after idle_s without a launch
    report["idle_mib"] = room_audit.memory_of(uids)
    report["tmp_while_idle"] = {n: _listing(f"/tmp/course-{n}") for n in names}
    for name in names:
        results[name].pop("session").close()   # a graceful kernel shutdown
    time.sleep(3)
    report["tmp_after_kernel"] = {n: _listing(f"/tmp/course-{n}") for n in names}
    for name in names:
        hub.stop_server(name)
    report["servers_stopped_s"] = round(_wait(hub.server_stopped, names, 300), 1)
    room_audit.wait_gone(uids)
    watcher.stop()
    report.update(learners=results, peak_mib=watcher.peak, load_max=watcher.load_max,
                  available_min_mib=watcher.available_min, exposed=watcher.exposed(),
                  listeners=len(watcher.listeners),
                  shm_seen={n: sorted(v) for n, v in watcher.shm.items()},
                  tmp_seen={n: sorted(v) for n, v in watcher.tmp.items()},
                  leftovers={n: v for n, v in room_audit.leftovers(uids).items()
                             if v["processes"] or v["files"]})
    return report


def _listing(folder: str) -> list:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


# ---------------------------------------------------------------- the report

def summarise(report: dict, options) -> dict:
    """Add the figures the instructor guide quotes, and the verdict."""
    learners = report["learners"]
    seconds = [r["seconds"] for r in learners.values() if "seconds" in r]
    errors = {n: r["errors"] for n, r in learners.items() if r["errors"]}
    idle = [v["pss"] for v in report["idle_mib"].values()]
    peak = [v["pss"] for v in report["peak_mib"].values()]
    report["summary"] = {
        "learners": len(learners), "lab": options.lab, "finished": len(seconds),
        "median_s": round(statistics.median(seconds), 1) if seconds else None,
        "max_s": max(seconds, default=None),
        "idle_pss_mib_median": round(statistics.median(idle)),
        "idle_pss_mib_max": round(max(idle)),
        "idle_rss_mib_max": round(max(v["rss"] for v in report["idle_mib"].values())),
        "peak_pss_mib_max": round(max(peak)),
        "peak_rss_mib_max": round(max(v["rss"] for v in report["peak_mib"].values())),
        "learners_with_errors": sorted(errors)}
    # A learner's own `!torchrun` listens on every interface (torch has no option to
    # bind it; lab 03 says so, the guide fences it): reported, not a labkit failure.
    by_labkit = [e for e in report["exposed"] if e[3] != "torchrun typed by the learner"]
    report["summary"]["exposed_by_labkit"] = by_labkit
    report["summary"]["exposed_by_learners_torchrun"] = (len(report["exposed"])
                                                         - len(by_labkit))
    report["ok"] = not (errors or by_labkit or report["isolation"]
                        or report["leftovers"] or len(seconds) < len(learners))
    return report


def print_report(report: dict) -> None:
    s, m = report["summary"], report["machine"]
    print(f"\n{s['learners']} learners, {s['lab']} (quick mode), on {m['cores']} cores, "
          f"{m['memory_gib']:.1f} GiB; load before {m['load_before']:.1f}, max "
          f"{report['load_max']:.1f}; memory available min "
          f"{report['available_min_mib']:,.0f} MiB")
    print(f"servers ready in {report['servers_ready_s']} s; finished {s['finished']}/"
          f"{s['learners']}: median {s['median_s']} s, max {s['max_s']} s")
    print(f"per learner, MiB: idle PSS median {s['idle_pss_mib_median']}, max "
          f"{s['idle_pss_mib_max']} (RSS max {s['idle_rss_mib_max']}); peak PSS max "
          f"{s['peak_pss_mib_max']} (RSS max {s['peak_rss_mib_max']})")
    for name, result in sorted(report["learners"].items()):
        for error in result["errors"]:
            print(f"  {name} cell {error['cell']}: {error['error'][:300]}")
    print(f"listening sockets seen: {report['listeners']}; beyond loopback, by labkit "
          f"or a kernel: {s['exposed_by_labkit'] or 'none'}; by learners' own "
          f"torchrun (lab 03's `!torchrun` cell): {s['exposed_by_learners_torchrun']}")
    print(f"isolation problems: {report['isolation'] or 'none'}")
    print(f"left in a learner's temp folder after a graceful kernel shutdown: "
          f"{sorted({e for v in report['tmp_after_kernel'].values() for e in v})}")
    print(f"left after the servers stopped: {report['leftovers'] or 'nothing'}")
    print("OK" if report["ok"] else "FAILED")


def _machine() -> dict:
    import psutil

    return {"cores": os.cpu_count(), "load_before": os.getloadavg()[0],
            "memory_gib": psutil.virtual_memory().total / 2**30,
            "available_before_mib": psutil.virtual_memory().available / 2**20,
            "date": time.strftime("%Y-%m-%d %H:%M")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--learners", "-k", type=int, default=8)
    parser.add_argument("--lab", default="03_ddp.ipynb")
    parser.add_argument("--idle-s", type=float, default=60.0,
                        help="the launcher helper's idle time (LABKIT_HELPER_IDLE_S)")
    parser.add_argument("--cell-timeout", type=float, default=900.0)
    parser.add_argument("--report", type=Path)
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root: it creates system users and spawns as them")
    install = hub_install.install()
    environment = {"LABKIT_QUICK": "1", "LABKIT_OFFLINE": "1",
                   "LABKIT_HELPER_IDLE_S": f"{options.idle_s:g}"}
    machine = _machine()
    accounts = make_users(options.learners)
    try:
        with running_hub(install, environment) as hub:
            report = rehearse(hub, accounts, options)
    finally:
        for account in accounts:
            remove_user(account.pw_name)
    report["machine"] = machine
    summarise(report, options)
    path = options.report or install.build / f"report-K{options.learners}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print_report(report)
    print(f"report: {path}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
