"""The helper process ranks are forked from: start it, keep it while launches run, let
it go when idle (the plumbing behind ``launch.run``).

The helper is multiprocessing's ``forkserver``, told to import torch and labkit
first (``PRELOAD``, and the modules the open lab's ranks import: ``preload``), so
every rank starts with them loaded. It holds about half a GiB
(torch, torch._dynamo, torchvision), which on a classroom server counts once per
learner: it stops after ``LABKIT_HELPER_IDLE_S`` seconds (default 900) without a
launch, and the next launch starts it again, saying so. Its temporary files (torch's
compile-cache folder, created by importing torch._dynamo) go to a folder of its own,
removed when it stops; that folder and multiprocessing's socket folder (``pymp-*``)
are in the kernel's scratch folder (``labkit.scratch``), removed when the kernel
ends even if it was killed.
"""

import atexit
import multiprocessing
import multiprocessing.util
import os
import shutil
import sys
import tempfile
import threading
from contextlib import contextmanager
from multiprocessing import forkserver

import psutil

from labkit import scratch
from labkit.messages import _

__all__ = ["PRELOAD", "NVML_CHECK", "IDLE_ENV", "preload", "context", "start", "stop",
           "in_use"]

# Imported once by the forkserver, so each rank starts with them already loaded.
# torch._dynamo is what the first DistributedDataParallel(...) imports (about 2-3 s
# per rank per launch otherwise); importing it leaves the server single-threaded.
# torchvision is what labkit.data reads MNIST with (imported there only when used:
# about 1 s per rank otherwise). None of them queries CUDA (tests/runtime/
# test_launch.py checks it), and the server runs with NVML_CHECK set, so that a later
# ``torch.cuda.is_available()`` there would ask NVML, not the CUDA driver: a process
# whose CUDA driver was initialised cannot fork ranks that use CUDA.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torchvision", "labkit.launch",
           "labkit.data"]
NVML_CHECK = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
IDLE_ENV = "LABKIT_HELPER_IDLE_S"   # "0": the helper stays until the kernel exits
# 15 minutes: a learner between two checks keeps it (starting it costs a check about
# 3 s on an idle 2-core machine, 11-14 s under a room's load); one who has stepped
# away gives its memory back. A hub short of memory sets less (INSTRUCTORS.md).
IDLE_S = 900.0
FOLDER_ENV = "LABKIT_HELPER_FOLDER"   # set in the helper's environment only

# The forkserver is one per process (multiprocessing's own global), so is this: how
# many launches use it now, the idle timer, its temp folder, and whether it was
# stopped for being idle (the next start says so).
_LOCK = threading.RLock()
_STATE = {"launches": 0, "timer": None, "folder": None, "stopped_idle": False}


def context():
    """Return a start method safe with CUDA: forkserver (preloaded), else spawn.

    ``LABKIT_START_METHOD=spawn`` forces a fresh interpreter per rank (slower).
    """
    method = os.environ.get("LABKIT_START_METHOD", "forkserver")
    if method not in multiprocessing.get_all_start_methods() or method == "fork":
        method = "spawn"   # never fork the notebook: it may have touched CUDA
    chosen = multiprocessing.get_context(method)
    if method == "forkserver":
        chosen.set_forkserver_preload(preload())
    return chosen


def preload() -> list:
    """``PRELOAD``, and what the ranks of every lab imported here will import: a lab's
    room lists those modules in its ``RANK_MODULES`` (lab 10's harness, about 45 ms of
    CPU a rank otherwise, and its check starts 27 ranks)."""
    rooms = [module for name, module in list(sys.modules.items())
             if name.startswith("labkit.labs.") and name.count(".") == 2]
    extra = {name for room in rooms for name in getattr(room, "RANK_MODULES", ())}
    return PRELOAD + sorted(extra)


def _running() -> bool:
    """Whether the forkserver is up (a server that died is not: the next start
    replaces it)."""
    pid = forkserver._forkserver._forkserver_pid
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def start() -> None:
    """Start the forkserver now, with ``NVML_CHECK`` set; it imports ``PRELOAD``.

    The server copies this process's environment when it starts, so the variables
    are set just for that moment; ranks get the parent's environment of each launch.
    """
    if context().get_start_method() != "forkserver":
        return
    with _LOCK:
        if not _running():
            if _STATE["stopped_idle"]:
                print(_("[launch] starting the helper that preloads torch again (it "
                        "had stopped after {idle:g} s without a launch, to free its "
                        "memory): this launch takes a few seconds more.").format(
                            idle=_idle_s()), flush=True)
                _STATE["stopped_idle"] = False
            if _STATE["folder"]:
                shutil.rmtree(_STATE["folder"], ignore_errors=True)
            kernel_folder = scratch.folder()
            folder = _STATE["folder"] = tempfile.mkdtemp(prefix="labkit-helper-",
                                                         dir=kernel_folder)
            _multiprocessing_temp_dir_in(kernel_folder)
            _with_environment(
                {**NVML_CHECK, "TMPDIR": folder, FOLDER_ENV: folder,
                 "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor")},
                forkserver.ensure_running)
        # else it is up: started here, or by multiprocessing itself for a Process of
        # the forkserver context (lab 09's kill_during_save), without a folder of ours
        if not _STATE["launches"]:
            _arm_timer()   # warmed up ahead of a launch that may never come


def _multiprocessing_temp_dir_in(parent: str) -> None:
    """Have multiprocessing make its temp folder (``pymp-*``, which holds the
    forkserver's socket) in ``parent``, unless it made one already.

    multiprocessing creates it on first use in ``tempfile.gettempdir()`` and removes
    it only at a normal exit of this process. A socket's path has at most 107 bytes:
    under a parent too deep for that, the folder stays where multiprocessing puts it.
    """
    socket_path = os.path.join(parent, "pymp-12345678", "listener-12345678")
    if len(os.fsencode(socket_path)) > 107:
        return
    saved, tempfile.tempdir = tempfile.tempdir, parent
    try:
        multiprocessing.util.get_temp_dir()
    finally:
        tempfile.tempdir = saved


def _with_environment(variables: dict, call) -> None:
    """Call ``call()`` with ``variables`` set in os.environ, then put them back."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        call()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def stop(idle: bool = False) -> None:
    """Stop the forkserver now (the next launch starts it again) and remove its folder.

    multiprocessing has no public call for this: ``ForkServer._stop`` is the one its
    own tests use (it closes the pipe the server watches, waits for it, removes its
    socket).
    """
    with _LOCK:
        if _running():
            try:
                forkserver._forkserver._stop()
            except ChildProcessError:   # already reaped
                forkserver._forkserver._forkserver_pid = None
            _STATE["stopped_idle"] = idle
        if _STATE["folder"]:
            shutil.rmtree(_STATE["folder"], ignore_errors=True)
            _STATE["folder"] = None


def _idle_s() -> float:
    try:
        return max(0.0, float(os.environ.get(IDLE_ENV, IDLE_S)))
    except ValueError:
        return IDLE_S


def _arm_timer() -> None:
    """Stop the server once it has been idle for ``LABKIT_HELPER_IDLE_S`` seconds."""
    _cancel_timer()
    if not _idle_s():
        return
    timer = threading.Timer(_idle_s(), _stop_if_idle)
    timer.daemon = True   # never keeps the kernel alive
    timer.start()
    _STATE["timer"] = timer


def _cancel_timer() -> None:
    if _STATE["timer"] is not None:
        _STATE["timer"].cancel()
        _STATE["timer"] = None


def _stop_if_idle() -> None:
    with _LOCK:
        if not _STATE["launches"]:
            stop(idle=True)


@contextmanager
def in_use():
    """Keep the server up while a launch runs; the idle clock starts when none does."""
    with _LOCK:
        _STATE["launches"] += 1
        _cancel_timer()
    try:
        yield
    finally:
        with _LOCK:
            _STATE["launches"] -= 1
            if not _STATE["launches"]:
                _arm_timer()


if os.environ.get(FOLDER_ENV):
    # This is the helper itself, importing PRELOAD. It exits when the process that
    # started it does, even one that was killed (its pipe closes): its folder goes
    # then. Ranks forked from it exit with os._exit, skipping this.
    atexit.register(shutil.rmtree, os.environ[FOLDER_ENV], True)
else:
    atexit.register(stop)   # a kernel that shuts down stops its helper first
