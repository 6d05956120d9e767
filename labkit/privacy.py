"""Keep a single-node job to itself: sockets on loopback only, temp files in a
folder of its own, torchrun in a network namespace of its own.

Taught in: nowhere (classroom plumbing: env/jupyterhub/README.md, "What listens on
the network"). ``launch.run`` gives every rank ``job_environment``; lab 03's and lab
09's torchrun checks run their command through ``loopback_only``.
"""

import functools
import os
import shutil
import socket
import subprocess
import sys

import psutil

from labkit.messages import _

__all__ = ["job_environment", "loopback_only", "private_network", "loopback_interface"]

def loopback_interface() -> str:
    """The name of the interface that holds 127.0.0.1 ("lo" on Linux, "lo0" on macOS)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1"
               for a in addresses):
            return name
    return "lo"


def job_environment(folder: str) -> dict:
    """The variables that keep a single-node job private: its temp files and torch's
    compile cache in ``folder`` (removed with it: importing torch._dynamo makes
    ``$TMPDIR/torchinductor_<user>`` and writes its path into os.environ, so an
    inherited value says nothing about the learner's wish), gloo's and NCCL's sockets
    on loopback (by default they take the interface the host name resolves to, which
    on a server is its network card)."""
    loopback = loopback_interface()
    return {"TMPDIR": folder, "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor"),
            "GLOO_SOCKET_IFNAME": loopback, "NCCL_SOCKET_IFNAME": loopback}


def _unshare(command: list) -> list:
    return ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-m",
            "labkit._loopback_only", *command]


@functools.cache
def private_network() -> bool:
    """Whether this user may make a network namespace of their own (Linux, with
    unprivileged user namespaces allowed: Debian yes; Docker's default seccomp and
    Ubuntu 24.04's AppArmor default no)."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        done = subprocess.run(_unshare(["true"]), capture_output=True, timeout=30,
                              env=env)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def loopback_only(command: list) -> tuple[list, bool]:
    """Return ``command`` made to run in a network namespace of its own, with only
    loopback, and True; or ``command`` unchanged and False, after a line that says
    so, where that is not allowed.

    For torchrun: its rendezvous store and the store it shares with the workers
    listen on every interface ("::") and it has no option to bind them to one, so a
    namespace is the only fence (the command's PYTHONPATH must reach labkit).
    """
    if private_network():
        return _unshare(command), True
    print(_("[check] torchrun's rendezvous stores listen on every network interface "
            "(torch has no option to bind them to one), and this machine allows no "
            "private network namespace to hide them in: they are reachable from the "
            "network while the check runs."))
    return list(command), False
