"""A room of learners on one machine: what a launch exposes, leaves, waits for and
refuses (labkit.crowding, labkit._forkserver; CPU, gloo, 2 ranks).

The workers live at module level so that ranks can import them.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist
from multiprocessing import forkserver

from labkit import _forkserver, crowding, launch, scratch
from labkit.checks import ExerciseFailed
from labkit.checks import _programs
from listeners import is_loopback

BUSY = crowding.MachineLoad(load=13.9, cores=2, available_bytes=414_000_000)
QUIET = crowding.MachineLoad(load=0.1, cores=2, available_bytes=20 * 2**30)


# ---------------------------------------------------------------- workers


def listeners_seen(ctx, parent_pid):
    """Every listening TCP socket of this rank and of the launching process, once the
    process group (gloo's own sockets included) is up."""
    dist.barrier()
    found = []
    for pid in (os.getpid(), parent_pid):
        for conn in psutil.Process(pid).net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                found.append((pid, conn.laddr.ip, conn.laddr.port))
    dist.barrier()
    return found


def sleep_then_return(ctx, seconds):
    time.sleep(seconds)
    return ctx.rank


def temp_folder(ctx):
    return tempfile.gettempdir(), os.environ.get("TORCHINDUCTOR_CACHE_DIR")


# ---------------------------------------------------------------- nothing beyond loopback


def test_a_launch_listens_on_loopback_only(capsys):
    """During a 2-rank launch, is every listening socket (the store in the parent,
    gloo's in the ranks) bound to loopback, and does the launcher say so?"""
    ranks = launch.run(listeners_seen, 2, args=(os.getpid(),), backend="gloo")
    found = [entry for rank in ranks for entry in rank]
    assert found, "the store and gloo listen somewhere"
    exposed = [entry for entry in found if not is_loopback(entry[1])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert "127.0.0.1" in {ip for _pid, ip, _port in found}
    assert "loopback only" in capsys.readouterr().out


# ---------------------------------------------------------------- nothing left behind


def test_ranks_get_the_launchs_own_temp_folder_and_it_goes():
    """Do ranks write temp files in the launch's folder (in the kernel's scratch
    folder), removed at its end, with the torch compile cache there too?"""
    folder, cache = launch.run(temp_folder, 1, backend="gloo")[0]
    assert os.path.dirname(folder) == scratch.folder() and cache.startswith(folder)
    assert not os.path.exists(folder)


@pytest.mark.parametrize("now", [False, True], ids=["graceful_nbclient", "at_once_nbval"])
def test_a_jupyter_kernel_leaves_nothing_in_its_temp_folder(tmp_path, now):
    """A real Jupyter kernel runs a 2-rank launch and is shut down as nbclient does
    (graceful: ipykernel terminates its children, then the kernel is killed if slow)
    or as nbval does (killed at once): is its TMPDIR empty afterwards (no pymp-*, no
    labkit-helper-*, no labkit-kernel-*), and every process of it gone?"""
    jupyter_client = pytest.importorskip("jupyter_client")
    tmp = Path(tempfile.mkdtemp(prefix="kernel-tmp-", dir="/tmp"))   # short: sockets
    manager = jupyter_client.KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(tmp_path), env={**os.environ, "TMPDIR": str(tmp)})
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        tests = os.path.dirname(os.path.dirname(__file__))
        code = (f"import sys; sys.path[:0] = [{tests!r}, {os.path.dirname(__file__)!r}]\n"
                "import test_crowding\nfrom labkit import launch\n"
                "print(launch.run(test_crowding.sleep_then_return, 2, args=(0,), "
                "backend='gloo'))")
        reply = client.execute_interactive(code, timeout=120, output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok", reply["content"].get("traceback")
        assert [p.name.split("-")[1] for p in tmp.iterdir()] == ["kernel"]
        kernel = psutil.Process(manager.provisioner.pid)
        family = [kernel, *kernel.children(recursive=True)]
        assert len(family) >= 3, "the kernel, its helper and its folder's watcher"
        client.stop_channels()
        manager.shutdown_kernel(now=now)
        deadline = time.monotonic() + 30
        while list(tmp.iterdir()) or any(
                p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family):
            assert time.monotonic() < deadline, (
                f"left behind: {sorted(p.name for p in tmp.iterdir())}, processes "
                f"{[p.pid for p in family if p.is_running()]}")
            time.sleep(0.2)
    finally:   # a failed run leaves nothing in /tmp either
        if manager.is_alive():
            client.stop_channels()
            manager.shutdown_kernel(now=True)
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_helper_stops_when_idle_and_comes_back_saying_so(monkeypatch, capsys):
    """After LABKIT_HELPER_IDLE_S idle seconds, is the forkserver gone (its folder
    too), and does the next launch start it again, saying so once?"""
    monkeypatch.setenv("LABKIT_HELPER_IDLE_S", "0")   # up, with no timer, while we look
    launch.warm_up()
    pid, folder = forkserver._forkserver._forkserver_pid, _forkserver._STATE["folder"]
    assert pid is not None and os.path.isdir(folder)
    # A launch's end arms the idle timer (on a loaded machine it may fire before this
    # thread runs again: hence the look above, not after the launch).
    monkeypatch.setenv("LABKIT_HELPER_IDLE_S", "1")
    launch.run(sleep_then_return, 1, args=(0,), backend="gloo")
    deadline = time.monotonic() + 30
    while forkserver._forkserver._forkserver_pid is not None:
        assert time.monotonic() < deadline, "the idle helper never stopped"
        time.sleep(0.2)
    assert not psutil.pid_exists(pid) and not os.path.exists(folder)
    capsys.readouterr()
    assert launch.run(sleep_then_return, 2, args=(0,), backend="gloo") == [0, 1]
    assert capsys.readouterr().out.count("starting the helper that preloads torch") == 1
    monkeypatch.setenv("LABKIT_HELPER_IDLE_S", "0")   # the rest of the suite keeps it
    launch.warm_up()


# ---------------------------------------------------------------- a crowded machine


def test_a_helper_started_by_multiprocessing_itself_serves_launches():
    """When a forkserver Process (lab 09's kill_during_save) started the helper
    before any launch did, does the next launch use it (no folder of labkit's)?"""
    _forkserver.stop()
    try:
        _forkserver.context().Process(target=time.sleep, args=(0,)).start()
        assert _forkserver._running() and _forkserver._STATE["folder"] is None
        assert launch.run(sleep_then_return, 2, args=(0,), backend="gloo") == [0, 1]
    finally:   # the next tests want labkit's own helper (NVML check, its folder)
        _forkserver.stop()


def test_the_learners_rank_cap_counts_their_other_launches(monkeypatch, tmp_path):
    """With LABKIT_MAX_RANKS=3, is a 2-rank launch refused while another 2-rank
    launch of the same learner runs, and allowed once it ended?"""
    monkeypatch.setenv("LABKIT_MAX_RANKS", "3")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = threading.Thread(target=launch.run, args=(sleep_then_return, 2),
                             kwargs={"args": (6,), "backend": "gloo"})
    first.start()
    deadline = time.monotonic() + 30
    while not list((tmp_path / "labkit" / "launches").glob("*.json")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(launch.LaunchError, match=r"at most 3 rank\(s\).*hold 2"):
        launch.run(sleep_then_return, 2, args=(0,), backend="gloo")
    first.join(60)
    assert launch.run(sleep_then_return, 2, args=(0,), backend="gloo") == [0, 1]
    assert not list((tmp_path / "labkit" / "launches").glob("*.json"))


def test_the_thread_cap_is_ranks_times_threads(monkeypatch, tmp_path):
    """With LABKIT_MAX_THREADS=2, are 2 ranks x 2 threads refused, with the cap's name,
    even with allow_oversubscription=True?"""
    monkeypatch.setenv("LABKIT_MAX_THREADS", "2")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(launch.LaunchError, match="LABKIT_MAX_THREADS"):
        launch.run(sleep_then_return, 2, args=(0,), backend="gloo", threads_per_rank=2,
                   allow_oversubscription=True)


def test_a_bad_cap_is_a_clear_error(monkeypatch):
    """Is LABKIT_MAX_RANKS=lots refused with what it must be?"""
    monkeypatch.setenv("LABKIT_MAX_RANKS", "lots")
    with pytest.raises(ValueError, match="positive whole number"):
        launch.run(sleep_then_return, 1, args=(0,), backend="gloo")


def test_a_launch_waits_for_memory_other_launches_hold(monkeypatch, capsys):
    """When memory is short, does a launch wait (saying so) and go on once it is
    back, instead of failing at once?"""
    answers = iter([2**28, 2**28, 2**28])   # then 16 GiB: ranks + 1 GiB to spare
    monkeypatch.setattr(crowding.hardware, "memory_available_bytes",
                        lambda: next(answers, 2**34))
    assert launch.run(sleep_then_return, 2, args=(0,), backend="gloo") == [0, 1]
    assert "waiting up to 120 s for memory" in capsys.readouterr().out


def test_a_busy_machine_is_said_with_its_numbers(monkeypatch, capsys):
    """On an overloaded machine, does a launch say so, with load, cores and memory?"""
    monkeypatch.setattr(crowding, "now", lambda: BUSY)
    monkeypatch.setattr(crowding, "_WARNED", [])
    crowding.check_launch(2, 1, "cpu", allow_oversubscription=True)
    out = capsys.readouterr().out
    assert "this machine is busy (load 13.9 on 2 core(s), 414 MB free)" in out


def test_a_timeout_on_a_busy_machine_names_the_load(monkeypatch):
    """When a check's collective times out on an overloaded machine, does the hint
    say so, with the numbers, beside the classic mistake (and not when quiet)?"""
    def timed_out(*args, **kwargs):
        raise launch.CollectiveTimeout("waited", [1])

    monkeypatch.setattr(launch, "run", timed_out)
    for state, busy in ((BUSY, True), (QUIET, False)):
        monkeypatch.setattr(crowding, "now", lambda state=state: state)
        with pytest.raises(ExerciseFailed, match="never matched") as err:
            _programs.launch_program("demo", sleep_then_return, hang_hint="")
        said = "overloaded right now (load 13.9 on 2 core(s), 414 MB free)"
        assert (said in str(err.value)) == busy


def test_a_check_waits_longer_on_a_busy_machine(monkeypatch, capsys):
    """Is a check's timeout stretched by the load per core (at most 8x), saying so?"""
    monkeypatch.setattr(crowding, "now", lambda: BUSY)   # 13.9 / (2 x 2) = 3.5x
    assert crowding.patience(30) == pytest.approx(30 * 13.9 / 4)
    assert "waiting up to 104 s instead of 30 s" in capsys.readouterr().out
    monkeypatch.setattr(crowding, "now", lambda: QUIET)
    assert crowding.patience(30) == 30 and capsys.readouterr().out == ""


def test_a_slow_command_on_a_busy_machine_gets_more_time(monkeypatch, capsys):
    """Does run_command give a command past its timeout more time while the machine
    is overloaded (saying so), and none when it is quiet?"""
    sleep = [sys.executable, "-c", "import time; time.sleep(2)"]
    monkeypatch.setattr(crowding, "now", lambda: BUSY)
    done = _programs.run_command(sleep, timeout=0.5, busy_extra=20)
    assert done.returncode == 0 and "on a busy machine" in capsys.readouterr().out
    monkeypatch.setattr(crowding, "now", lambda: QUIET)
    with pytest.raises(subprocess.TimeoutExpired):
        _programs.run_command(sleep, timeout=0.5, busy_extra=20)


_KILLED_KERNEL = """
import time
from labkit import _forkserver, launch
from runtime.test_crowding import sleep_then_return
launch.run(sleep_then_return, 1, args=(0,), backend="gloo")
print("helper folder:", _forkserver._STATE["folder"], flush=True)
time.sleep(600)
"""


def test_a_killed_kernel_leaves_no_helper_folder(tmp_path):
    """When the process that started the helper is killed (no atexit), does the
    helper still remove its temp folder as it exits?"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(tmp_path)}
    kernel = subprocess.Popen([sys.executable, "-c", _KILLED_KERNEL], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        lines = iter(kernel.stdout.readline, "")
        folder = next(line for line in lines if line.startswith("helper folder:"))
        folder = folder.split(":", 1)[1].strip()
        assert folder.startswith(str(tmp_path)) and os.path.isdir(folder)
    finally:
        kernel.kill()
        kernel.wait()
    deadline = time.monotonic() + 30
    while os.path.exists(folder):
        assert time.monotonic() < deadline, "the helper left its folder behind"
        time.sleep(0.2)
