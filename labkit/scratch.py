"""One temporary folder per kernel, gone when the kernel ends, however it ends.

Where it is taught: lab 03's "nothing left behind" cell lists ``/tmp`` before and
after the lab's launches; this is what keeps that list unchanged.

labkit's launches, its helper process (``_forkserver``) and multiprocessing's own
socket folder (``pymp-*``) put their files in this folder. A kernel does not always
get to clean up: Jupyter's shutdown first terminates the kernel's child processes
(ipykernel), then kills the kernel if it has not exited within seconds, and nbval
kills it at once; ``atexit`` never runs then. So a small watcher, started in a
session of its own (a shutdown's signals to the kernel's process group do not reach
it), waits for the kernel's end of a pipe to close, which happens when the kernel
exits or is killed, and then removes the folder.
"""

import os
import subprocess
import sys
import tempfile
import threading

__all__ = ["folder"]

# The watcher: no site packages (-S), a few MB; stdin's read returns at end of file,
# when no process holds the pipe's write end any more (the kernel and what it forked).
_WATCHER = ("import shutil, sys\n"
            "sys.stdin.buffer.read()\n"
            "shutil.rmtree(sys.argv[1], ignore_errors=True)\n")

_LOCK = threading.Lock()
_STATE = {"pid": None, "folder": None, "watcher": None}


def folder() -> str:
    """This process's scratch folder (created on first use, with its watcher).

    A process forked from this one gets a folder of its own: the watcher removes a
    folder when the process that made it is gone, not when a child is.
    """
    with _LOCK:
        if _STATE["pid"] != os.getpid() or not os.path.isdir(_STATE["folder"] or ""):
            path = tempfile.mkdtemp(prefix="labkit-kernel-")
            _STATE.update(pid=os.getpid(), folder=path, watcher=subprocess.Popen(
                [sys.executable, "-S", "-c", _WATCHER, path], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True))
        return _STATE["folder"]
