"""Share one machine with a room of learners: load, memory, per-learner caps, exposure.

Taught in: nowhere (classroom plumbing: INSTRUCTORS.md "Running the room" and
env/jupyterhub/README.md). ``launch.run`` asks it before starting ranks
(``check_launch``, ``claim``; the torchrun checks ``wait_for_memory``); the checks
wait longer on a crowded machine (``patience``), and timeout hints ask it whether
the machine, not the learner's code, is the likely cause (``overload_note``).
What a job may touch (loopback, its temp folder) is ``privacy``'s.
"""

import json
import os
import random
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from labkit import hardware
from labkit.messages import _

__all__ = ["LaunchRefused", "MachineLoad", "now", "check_launch", "claim",
           "wait_for_memory", "patience", "overload_note"]

# Set by the hub for every learner (env/jupyterhub/tljh_course.py): the most ranks,
# and the most CPU threads, that all of one learner's launches may run at once.
MAX_RANKS_ENV = "LABKIT_MAX_RANKS"
MAX_THREADS_ENV = "LABKIT_MAX_THREADS"
# How long a launch waits for memory that other launches hold (seconds).
MEMORY_WAIT_ENV = "LABKIT_MEMORY_WAIT_S"
MEMORY_WAIT_S = 120.0
# The launch's own size guard: CPU threads per usable core, and the memory one rank
# is counted at (a rank forked from the preloaded helper shares torch's pages; one
# started with spawn holds about 0.4 GiB of its own, plus its data and model).
RANKS_PER_CORE = 4
RANK_MEMORY_BYTES = 2**29
# A 1-minute load above this many runnable processes per core, or less memory than
# LOW_MEMORY_BYTES available, and the machine is overloaded: slowness is its doing.
BUSY_LOAD_PER_CORE = 2.0
LOW_MEMORY_BYTES = 2**30
WARN_EVERY_S = 600.0
_WARNED: list = []   # when this process last said the machine is busy


class LaunchRefused(RuntimeError):
    """This machine, or this learner's share of it, cannot hold the launch now
    (``launch.run`` raises it as its own LaunchError)."""


@dataclass(frozen=True)
class MachineLoad:
    """The machine as every learner's launch sees it now."""

    load: float                   # 1-minute load average (runnable processes)
    cores: int                    # cores this process may use
    available_bytes: int | None   # memory still available (None: unknown)

    @property
    def overloaded(self) -> bool:
        """Too many runnable processes per core, or too little memory left."""
        free = self.available_bytes
        low = free is not None and free < LOW_MEMORY_BYTES
        return self.load > BUSY_LOAD_PER_CORE * self.cores or low

    def describe(self) -> str:
        """E.g. "load 13.9 on 2 cores, 414 MB free"."""
        free = ("?" if self.available_bytes is None
                else f"{self.available_bytes / 1e6:,.0f}")
        return _("load {load:.1f} on {cores} core(s), {free} MB free").format(
            load=self.load, cores=self.cores, free=free)


def now() -> MachineLoad:
    """Read the machine's load and free memory (a container's limits count)."""
    try:
        load = os.getloadavg()[0]
    except OSError:   # no load average on this platform
        load = 0.0
    return MachineLoad(load, hardware.cpu_count(), hardware.memory_available_bytes())


def overload_note() -> str:
    """A sentence for a timeout's message when the machine is overloaded, else ""."""
    machine = now()
    if not machine.overloaded:
        return ""
    return _(" This machine is overloaded right now ({machine}): if your code looks "
             "right, the machine may just have been too slow. Run the cell again when "
             "it is quieter, or take the reference line.").format(
                 machine=machine.describe())


# ---------------------------------------------------------------- before a launch

def check_launch(world_size: int, threads_per_rank: int, device: str,
                 allow_oversubscription: bool) -> None:
    """Refuse a launch this machine, or this learner's share of it, cannot hold.

    The learner's caps (set by the hub) always hold; ``allow_oversubscription`` lifts
    only the machine-wide core and memory guards. A busy machine is said, not refused.
    """
    _check_learner_caps(world_size, threads_per_rank)
    if not allow_oversubscription:
        _check_cores(world_size, threads_per_rank, device)
        wait_for_memory(world_size)
    _say_if_busy()


def _env_cap(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(_("{name} must be a positive whole number, got {value!r}: ask "
                           "whoever runs this server.").format(name=name, value=value))
    return int(value)


def _check_learner_caps(world_size: int, threads_per_rank: int) -> None:
    """Refuse past LABKIT_MAX_RANKS / LABKIT_MAX_THREADS, this learner's running
    launches included (in every notebook of theirs)."""
    running = _running_launches()
    for name, asked, held in (
            (MAX_RANKS_ENV, world_size, sum(r["ranks"] for r in running)),
            (MAX_THREADS_ENV, world_size * threads_per_rank,
             sum(r["ranks"] * r["threads"] for r in running))):
        cap = _env_cap(name)
        if cap is not None and asked + held > cap:
            what = _("rank(s)") if name == MAX_RANKS_ENV else _("CPU thread(s)")
            raise LaunchRefused(_(
                "This server lets each learner run at most {cap} {what} at once "
                "({name}); this launch asks for {asked} and your other running "
                "launches hold {held}. Use fewer ranks (or threads_per_rank=1), or wait "
                "for your other notebook's launch to finish.").format(
                    cap=cap, what=what, name=name, asked=asked, held=held))


def _check_cores(world_size: int, threads_per_rank: int, device: str) -> None:
    cores = hardware.cpu_count()
    if world_size * threads_per_rank > RANKS_PER_CORE * cores:
        raise LaunchRefused(_(
            "{ranks} {device} rank(s) x {threads} CPU thread(s) on {cores} usable "
            "core(s) is over the limit of {limit} threads ({per_core} per core) that "
            "keeps this machine usable for everyone on it. Use world_size <= {most}, "
            "or {override}.").format(
                ranks=world_size, device=device.upper(), threads=threads_per_rank,
                cores=cores, limit=RANKS_PER_CORE * cores, per_core=RANKS_PER_CORE,
                most=RANKS_PER_CORE * cores // threads_per_rank,
                override=_override_advice()))


def _override_advice() -> str:
    return _("pass allow_oversubscription=True to launch.run if you really mean it")


def wait_for_memory(processes: int) -> None:
    """Wait (saying so) while other launches hold the memory ``processes`` new torch
    processes need, keeping LOW_MEMORY_BYTES free for the programs already running
    (below that, the machine evicts their code and thrashes); refuse with the numbers
    if it does not come back within LABKIT_MEMORY_WAIT_S seconds.

    Learners who launch at the same moment all see the same free memory: when it is
    tight, each waits a random second or two and looks again, so that the first
    ones' ranks show in what the later ones read.
    """
    need = processes * RANK_MEMORY_BYTES
    wait_s = float(os.environ.get(MEMORY_WAIT_ENV, MEMORY_WAIT_S))
    deadline, said = time.monotonic() + wait_s, False
    while True:
        available = hardware.memory_available_bytes()
        if available is None or available >= 2 * need + LOW_MEMORY_BYTES:
            return
        if available >= need + LOW_MEMORY_BYTES:
            time.sleep(random.uniform(0.5, 2.5))
            again = hardware.memory_available_bytes()
            if again is None or again >= need + LOW_MEMORY_BYTES:
                return
        if time.monotonic() >= deadline:
            break
        if not said:
            print(_("[launch] waiting up to {wait:g} s for memory: {ranks} process(es) "
                    "need about {need:.1f} GiB and {reserve:.0f} GiB stays free for the "
                    "programs already running; {available:.1f} GiB is available (other "
                    "launches on this machine hold the rest).").format(
                        wait=wait_s, ranks=processes, need=need / 2**30,
                        reserve=LOW_MEMORY_BYTES / 2**30, available=available / 2**30),
                  flush=True)
            said = True
        time.sleep(1.0)
    raise LaunchRefused(_(
        "{ranks} process(es) need about {need:.1f} GiB ({each:.1f} GiB each: torch, the "
        "data, the model) and {reserve:.0f} GiB stays free for the programs already "
        "running, but only {available:.1f} GiB of memory is available now. Use fewer "
        "ranks, close other notebooks, wait for the room to calm down, or "
        "{override}.").format(
            ranks=processes, need=need / 2**30, each=RANK_MEMORY_BYTES / 2**30,
            reserve=LOW_MEMORY_BYTES / 2**30, available=available / 2**30,
            override=_override_advice()))


def patience(timeout: float) -> float:
    """A check's ``timeout``, longer on an overloaded machine: times the load per
    core over BUSY_LOAD_PER_CORE, at most 8 times. A check's verdict must not depend
    on how crowded the room is; a real hang is still caught, later."""
    machine = now()
    factor = min(8.0, max(1.0, machine.load / (BUSY_LOAD_PER_CORE * machine.cores)))
    if factor > 1:
        print(_("[check] this machine is busy ({machine}): waiting up to {timeout:.0f} s "
                "instead of {usual:g} s before calling anything a hang.").format(
                    machine=machine.describe(), timeout=timeout * factor,
                    usual=timeout),
              flush=True)
    return timeout * factor


def _say_if_busy() -> None:
    """Print once in a while that the machine is overloaded, with its numbers."""
    machine = now()
    said_lately = _WARNED and time.monotonic() - _WARNED[0] < WARN_EVERY_S
    if not machine.overloaded or said_lately:
        return
    _WARNED[:] = [time.monotonic()]
    print(_("[launch] this machine is busy ({machine}): launches run slower than usual "
            "and timings here measure the crowd, not the code. The checks' verdicts do "
            "not depend on speed.").format(machine=machine.describe()), flush=True)


# ------------------------------------------------------------ this learner's launches

def _claims_folder() -> Path:
    """Where this learner's running launches are noted: their own cache folder
    (never /tmp, so nothing is left there, and no other learner can write in it)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return Path(cache) / "labkit" / "launches"


def _running_launches() -> list[dict]:
    """This learner's launches that are still running on this machine."""
    folder, found = _claims_folder(), []
    mine = f"{socket.gethostname()}-*.json"
    for path in folder.glob(mine) if folder.is_dir() else []:
        try:
            claim_ = json.loads(path.read_text())
            alive = psutil.pid_exists(claim_["pid"])
        except (OSError, ValueError, KeyError):
            continue
        if alive:
            found.append(claim_)
        else:   # its kernel died during the launch
            path.unlink(missing_ok=True)
    return found


@contextmanager
def claim(world_size: int, threads_per_rank: int):
    """Note this launch's ranks and threads for the learner's caps while it runs."""
    if _env_cap(MAX_RANKS_ENV) is None and _env_cap(MAX_THREADS_ENV) is None:
        yield   # no caps on this machine: nothing to count
        return
    folder = _claims_folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{socket.gethostname()}-{os.getpid()}-{time.monotonic_ns()}.json"
    path.write_text(json.dumps({"pid": os.getpid(), "ranks": world_size,
                                "threads": threads_per_rank}))
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
