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
on any error cell, exposure, isolation problem or leftover. When memory stays under
512 MiB for --thrash-s seconds (300), it stops, says how far each learner got, and
gives the machine back: a machine that thrashes does so for everyone on it.

hub_install.py installs, hub_server.py starts the hub and its users, hub_client.py
talks to it, room_audit.py watches the machine, rehearsal_report.py sums up.
"""

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# this folder's modules, then this checkout's labkit and coursetools (tooling/)
sys.path[:0] = [str(HERE), str(HERE.parents[1]), str(HERE.parents[1] / "tooling")]

import hub_install  # noqa: E402  (this folder's modules, after the path is set)
import rehearsal_report  # noqa: E402
import room_audit  # noqa: E402
from hub_client import KERNEL_DIED, Hub, KernelSession  # noqa: E402
from hub_server import make_users, remove_user, running_hub, wait_until  # noqa: E402

ROOT = HERE.parents[1]

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
            result.setdefault("cells", []).append((index, round(cell.seconds, 1)))
            if cell.error:
                errors.append({"cell": index, "error": cell.error,
                               "output": cell.text[-1500:]})
            if cell.error == KERNEL_DIED:   # what it held is gone: the learner stops here
                result["kernel_died_at_cell"] = index
                break
        else:   # every cell ran: the learner finished
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
    report = {"servers_ready_s": round(wait_until(hub.server_ready, names, 900), 1)}
    watcher = room_audit.Watcher(uids)
    watcher.start()
    report["server_only_mib"] = room_audit.memory_of(uids)
    report["isolation"] = room_audit.isolation_problems(
        accounts, [str(hub_install.BUILD / "course"), str(hub_install.BUILD / "mnist")])
    results = {name: {} for name in names}
    checks = hub_install.check_cells(options.lab)
    start = threading.Barrier(len(names))
    threads = [threading.Thread(target=run_learner, daemon=True, args=(
        hub, name, options.lab, checks, start, options.cell_timeout, results[name]))
        for name in names]
    for thread in threads:
        thread.start()
    report["stopped"] = _wait_for_learners(threads, watcher, options.thrash_s)
    if report["stopped"]:   # the machine ran out of memory: say so, and give it back
        report.update(learners=_plain(results), peak_mib=watcher.peak,
                      load_max=watcher.load_max, available_min_mib=watcher.available_min)
        watcher.stop()
        return report
    time.sleep(options.idle_s + 15)   # the helper stops after idle_s without a launch
    report["idle_mib"] = room_audit.memory_of(uids)
    report["cpu_s"] = room_audit.cpu_seconds_of(uids)   # the server's too
    report["tmp_while_idle"] = {n: _listing(f"/tmp/course-{n}") for n in names}
    for name in names:
        results[name].pop("session").close()   # a graceful kernel shutdown
    time.sleep(3)
    report["tmp_after_kernel"] = {n: _listing(f"/tmp/course-{n}") for n in names}
    for name in names:
        hub.stop_server(name)
    report["servers_stopped_s"] = round(wait_until(hub.server_stopped, names, 300), 1)
    room_audit.wait_gone(uids)
    watcher.stop()
    report.update(learners=_plain(results), peak_mib=watcher.peak,
                  load_max=watcher.load_max,
                  available_min_mib=watcher.available_min, exposed=watcher.exposed(),
                  listeners=len(watcher.listeners),
                  shm_seen={n: sorted(v) for n, v in watcher.shm.items()},
                  tmp_seen={n: sorted(v) for n, v in watcher.tmp.items()},
                  leftovers={n: v for n, v in room_audit.leftovers(uids).items()
                             if v["processes"] or v["files"]})
    return report


def _wait_for_learners(threads: list, watcher, thrash_s: float) -> str:
    """Wait for every learner; "" when all finished, else why the rehearsal stopped
    (memory under room_audit.SHORT_MIB for ``thrash_s``: the machine thrashes, and a
    shared one would thrash for everyone on it)."""
    while any(thread.is_alive() for thread in threads):
        if watcher.thrashing_for() > thrash_s:
            return (f"stopped: less than {room_audit.SHORT_MIB} MiB of memory available "
                    f"for {thrash_s:g} s (the machine thrashed)")
        time.sleep(2.0)
    return ""


def _plain(results: dict) -> dict:
    """The learners' results without their live sessions (for the JSON report)."""
    return {name: {k: v for k, v in r.items() if k != "session"}
            for name, r in results.items()}


def _listing(folder: str) -> list:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--learners", "-k", type=int, default=8)
    parser.add_argument("--lab", default="03_ddp.ipynb")
    parser.add_argument("--idle-s", type=float, default=60.0,
                        help="the launcher helper's idle time (LABKIT_HELPER_IDLE_S)")
    parser.add_argument("--cell-timeout", type=float, default=900.0)
    parser.add_argument("--thrash-s", type=float, default=300.0,
                        help="stop when memory stays under 512 MiB this long")
    parser.add_argument("--report", type=Path)
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root: it creates system users and spawns as them")
    install = hub_install.install()
    environment = {"LABKIT_QUICK": "1", "LABKIT_OFFLINE": "1",
                   "LABKIT_HELPER_IDLE_S": f"{options.idle_s:g}"}
    machine = rehearsal_report.machine()
    accounts = make_users(options.learners)
    try:
        with running_hub(install, environment) as hub:
            report = rehearse(hub, accounts, options)
    finally:
        for account in accounts:
            remove_user(account.pw_name)
    report["machine"] = machine
    rehearsal_report.summarise(report, options)
    path = options.report or install.build / f"report-K{options.learners}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    rehearsal_report.print_report(report)
    print(f"report: {path}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
