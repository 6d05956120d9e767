"""Watch a room of learners on one machine (used by rehearse.py, run as root).

While they work: each learner's memory (the sum over their processes: RSS, and PSS,
which shares a page among the processes that map it, so torch's libraries count
once for the room), the machine's load and free memory, every listening socket a
learner's process opened, and what they put in /dev/shm and /tmp. Then: whether one
learner can read or write another's files, and what is left once servers stop.
"""

import ipaddress
import os
import stat
import subprocess
import threading
import time

import psutil

__all__ = ["Watcher", "memory_of", "cpu_seconds_of", "isolation_problems",
           "wait_gone", "leftovers", "MiB"]

MiB = 2**20
SHARED_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
SHORT_MIB = 512   # less available than this, and the machine evicts running code


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def memory_of(uids: dict) -> dict:
    """Per learner (name -> uid): MiB of RSS, PSS and USS, and the process count."""
    by_uid = {uid: name for name, uid in uids.items()}
    totals = {name: {"rss": 0.0, "pss": 0.0, "uss": 0.0, "processes": 0}
              for name in uids}
    for process in psutil.process_iter(["uids"]):
        name = by_uid.get(process.info["uids"].real if process.info["uids"] else None)
        if name is None:
            continue
        try:
            info = process.memory_full_info()
        except psutil.Error:
            continue
        total = totals[name]
        total["rss"] += info.rss / MiB
        total["pss"] += info.pss / MiB
        total["uss"] += info.uss / MiB
        total["processes"] += 1
    return totals


def cpu_seconds_of(uids: dict) -> dict:
    """Per learner: CPU seconds (user + system) their processes used, with every
    process they started and waited for (ranks, torchrun: reaped, still counted).
    Unlike wall time, it hardly depends on how crowded the machine was."""
    by_uid = {uid: name for name, uid in uids.items()}
    totals = {name: 0.0 for name in uids}
    for process in psutil.process_iter(["uids"]):
        name = by_uid.get(process.info["uids"].real if process.info["uids"] else None)
        if name is None:
            continue
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        totals[name] += (times.user + times.system + times.children_user
                         + times.children_system)
    return totals


def _owned_entries(folder: str, uids: set) -> dict:
    """uid -> names of ``folder``'s top-level entries it owns."""
    found: dict = {}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    for entry in entries:
        try:
            owner = entry.stat(follow_symlinks=False).st_uid
        except OSError:
            continue
        if owner in uids:
            found.setdefault(owner, set()).add(entry.name)
    return found


def _origin(process: psutil.Process) -> str:
    """Who opened a listening socket: "torchrun typed by the learner" when it is a
    `torchrun ...` command line (a notebook's `!torchrun`, a terminal) or below one;
    else "labkit or the kernel" (launches; labkit's own checks run
    `python -m torch.distributed.run`, in a network namespace of their own)."""
    for each in [process, *process.parents()[:3]]:
        if any(os.path.basename(arg) == "torchrun" for arg in each.cmdline()[:2]):
            return "torchrun typed by the learner"
    return "labkit or the kernel"


class Watcher(threading.Thread):
    """Sample the room every ``every`` seconds until ``stop()``."""

    def __init__(self, uids: dict, every: float = 2.0):
        super().__init__(daemon=True)
        self.uids, self.every, self.done = uids, every, threading.Event()
        self.peak = {name: {"rss": 0.0, "pss": 0.0} for name in uids}
        self.load_max, self.available_min = 0.0, float("inf")
        self.short_since = None   # since when memory has stayed under SHORT_MIB
        self.listeners, self.shm, self.tmp = set(), {}, {}

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.sample()

    def sample(self) -> None:
        for name, used in memory_of(self.uids).items():
            for key in ("rss", "pss"):
                self.peak[name][key] = max(self.peak[name][key], used[key])
        self.load_max = max(self.load_max, os.getloadavg()[0])
        available = psutil.virtual_memory().available / MiB
        self.available_min = min(self.available_min, available)
        if available >= SHORT_MIB:
            self.short_since = None
        elif self.short_since is None:
            self.short_since = time.monotonic()
        self._sample_sockets()
        names = {uid: name for name, uid in self.uids.items()}
        for folder, seen in (("/dev/shm", self.shm), ("/tmp", self.tmp)):
            for uid, entries in _owned_entries(folder, set(names)).items():
                seen.setdefault(names[uid], set()).update(entries)

    def _sample_sockets(self) -> None:
        by_uid = {uid: name for name, uid in self.uids.items()}
        for conn in psutil.net_connections(kind="inet"):
            if conn.status != psutil.CONN_LISTEN or conn.pid is None:
                continue
            try:
                process = psutil.Process(conn.pid)
                uid, origin = process.uids().real, _origin(process)
            except psutil.Error:
                continue
            if uid in by_uid:
                self.listeners.add((by_uid[uid], conn.laddr.ip, conn.laddr.port, origin))

    def thrashing_for(self) -> float:
        """Seconds memory has stayed under SHORT_MIB (0: it has not)."""
        return 0.0 if self.short_since is None else time.monotonic() - self.short_since

    def exposed(self) -> list:
        """Learners' listening sockets bound beyond loopback, with their origin."""
        return sorted(entry for entry in self.listeners if not _is_loopback(entry[1]))

    def stop(self) -> None:
        self.done.set()
        self.join(30)


def _as(account, command: list) -> bool:
    """Run ``command`` as ``account`` (a pwd entry); True if it succeeded."""
    done = subprocess.run(command, user=account.pw_uid, group=account.pw_gid,
                          extra_groups=[], capture_output=True, timeout=60,
                          cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": account.pw_dir})
    return done.returncode == 0


def isolation_problems(accounts: list, shared: list) -> list:
    """What one learner can do to another's files, or to the shared read-only ones.

    ``accounts``: pwd entries of the learners; ``shared``: folders every learner
    reads and none may write (the course install, the data).
    """
    problems = []
    for account in accounts:
        mode = stat.S_IMODE(os.stat(account.pw_dir).st_mode)
        if mode & 0o077:
            problems.append(f"{account.pw_name}'s home is mode {mode:o}: others can "
                            "read it")
    for me, other in zip(accounts, accounts[1:] + accounts[:1]):
        if me is other:
            break
        if _as(me, ["ls", other.pw_dir]):
            problems.append(f"{me.pw_name} can list {other.pw_name}'s home")
        private = os.path.join("/tmp", f"course-{other.pw_name}")
        if os.path.isdir(private) and _as(me, ["ls", private]):
            problems.append(f"{me.pw_name} can list {other.pw_name}'s temp folder")
    for folder in shared:
        probe = os.path.join(folder, ".rehearsal-write-probe")
        if accounts and _as(accounts[0], ["touch", probe]):
            problems.append(f"{accounts[0].pw_name} can write into {folder}")
            os.unlink(probe)
    return problems


def _processes_of(uids: dict) -> dict:
    """Per learner: the command lines of their processes still running."""
    by_uid = {uid: name for name, uid in uids.items()}
    found = {name: [] for name in uids}
    for process in psutil.process_iter(["uids", "cmdline"]):
        name = by_uid.get(process.info["uids"].real if process.info["uids"] else None)
        if name:
            found[name].append(" ".join(process.info["cmdline"] or [])[:120])
    return found


def wait_gone(uids: dict, limit: float = 60.0) -> None:
    """Wait until no learner process is left (a stopping server ends its kernels)."""
    deadline = time.monotonic() + limit
    while any(_processes_of(uids).values()) and time.monotonic() < deadline:
        time.sleep(1.0)


def leftovers(uids: dict) -> dict:
    """Per learner: their processes still running, and anything they own in /tmp,
    /var/tmp or /dev/shm (searched to the bottom)."""
    by_uid = {uid: name for name, uid in uids.items()}
    left = {name: {"processes": procs, "files": []}
            for name, procs in _processes_of(uids).items()}
    for root in SHARED_ROOTS:
        for folder, subfolders, files in os.walk(root):
            for entry in subfolders + files:
                path = os.path.join(folder, entry)
                try:
                    owner = os.lstat(path).st_uid
                except OSError:
                    continue
                if owner in by_uid:
                    left[by_uid[owner]]["files"].append(path)
    return left
