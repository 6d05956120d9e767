"""Run a script under torchrun from a notebook, SIGKILL one of its ranks at a known
step, and read back what each attempt of the worker group did.

Taught in: lab 09 (elastic restarts). The script under torchrun calls
``record_start`` when it knows where it resumes and ``pause_if_asked`` after each
step; ``torchrun_with_kill`` runs it with ``--max-restarts``, waits until every rank
holds at the chosen step (so the kill never races the training), asks each rank for
its Python stacks (SIGUSR1, if the script registered faulthandler for it), kills one
rank, and waits for torchrun to restart the group and finish.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.multinode import NO_SHARED_STORE

__all__ = ["PAUSE_ENV", "KILLED", "TORCHRUN", "PRELOADED", "restart_count",
           "record_start", "pause_if_asked", "starts", "Run", "torchrun_with_kill"]

PAUSE_ENV = "LABKIT_PAUSE_AT_STEP"   # set by torchrun_with_kill only
PAUSE_S = 120.0                      # a paused rank goes on after this, killed or not
KILLED = "killed"                    # written in the folder before the kill
# torch 2.14's torchrun shares its rendezvous TCPStore with the workers by default,
# and a restarted group can read the dead group's addresses from it (pytorch/pytorch
# #135712, #167288): gloo then fails with "connectFullMesh failed ... Connection
# refused". Lab 09 shows the error; every run here turns the sharing off
# (NO_SHARED_STORE, from labkit.multinode).
# The runner: the real torchrun (every rank a new Python that imports torch: what a
# restart costs, which the lab times), or labkit's, whose ranks are forked with torch
# already imported (the check's, which must answer in seconds on a loaded machine).
TORCHRUN, PRELOADED = "torch.distributed.run", "labkit.torchrun_preloaded"


def restart_count() -> int:
    """Return which attempt of the worker group this is (torchrun counts from 0)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def record_start(folder, ctx, step: int) -> None:
    """Write this rank's pid and resume step for this attempt (the parent reads it)."""
    record = {"rank": ctx.rank, "restart": restart_count(), "pid": os.getpid(),
              "step": step, "time": time.time(), "world_size": ctx.world_size}
    name = f"start.rank{ctx.rank}.restart{record['restart']}.json"
    tmp = Path(folder) / f"{name}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, Path(folder) / name)   # the parent never reads half a record


def pause_if_asked(folder, ctx, step: int) -> None:
    """Hold at step ``$LABKIT_PAUSE_AT_STEP`` to be killed there, once per run.

    Does nothing unless ``torchrun_with_kill`` asked for it. The rank writes
    ``paused.rank<N>.restart<K>`` and sleeps (up to ``PAUSE_S``), so the kill lands
    at a known step whatever the speed of the machine. The first attempt of the
    group that gets there holds (an attempt that failed earlier, e.g. a rendezvous
    refused on a loaded machine, does not take the pause away); once the parent has
    killed (``KILLED``), no later attempt holds.
    """
    if os.environ.get(PAUSE_ENV) != str(step) or (Path(folder) / KILLED).exists():
        return
    name = f"paused.rank{ctx.rank}.restart{restart_count()}"
    (Path(folder) / name).write_text(str(os.getpid()))
    time.sleep(PAUSE_S)


def starts(folder) -> list[dict]:
    """Return every rank's start records, ordered by (attempt, rank)."""
    found = [json.loads(p.read_text()) for p in Path(folder).glob("start.rank*.json")]
    return sorted(found, key=lambda r: (r["restart"], r["rank"]))


@dataclass
class Run:
    """What a torchrun run with a kill did (times in seconds, ``time.time()``)."""

    returncode: int | None
    log: str
    starts: list = field(default_factory=list)
    killed: dict | None = None      # the start record of the rank that was killed
    kill_time: float | None = None
    seconds: float = 0.0
    timed_out: bool = False

    def restarts(self) -> int:
        """Return how many times torchrun restarted the worker group."""
        return max((s["restart"] for s in self.starts), default=0)

    def after_kill(self) -> list[dict]:
        """Return the start records of the attempt right after the kill."""
        if self.killed is None:
            return []
        return [s for s in self.starts if s["restart"] == self.killed["restart"] + 1]


def _command(script, args, nproc: int, max_restarts: int, runner: str) -> list[str]:
    # --local-addr: the workers meet at 127.0.0.1, not at the host name's address,
    # which a network namespace with loopback alone cannot reach (privacy.loopback_only)
    return [sys.executable, "-m", runner, "--standalone",
            "--local-addr=127.0.0.1", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", str(script), *map(str, args)]


def _environment(script: Path, pause_at: int | None, extra: dict) -> dict:
    """The run's environment: one thread per rank, the script's folder importable."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(script.parent), *sys.path]),
           **NO_SHARED_STORE, **extra}
    if pause_at is not None:
        env[PAUSE_ENV] = str(pause_at)
    return env


def _wait_for_pause(folder: Path, nproc: int, process, deadline: float) -> int | None:
    """Wait until every rank of one attempt holds; return that attempt (None: the
    run ended or time ran out first)."""
    while True:
        for restart in range(64):
            held = [folder / f"paused.rank{r}.restart{restart}" for r in range(nproc)]
            if all(p.exists() for p in held):
                return restart
        if process.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _kill(folder: Path, restart: int, kill_rank: int, stacks: bool):
    """Ask every paused rank of attempt ``restart`` for its stacks, then SIGKILL one;
    return its record."""
    (folder / KILLED).write_text(str(restart))   # the restarted ranks must not hold
    records = {s["rank"]: s for s in starts(folder) if s["restart"] == restart}
    if stacks:   # one rank at a time, so their stacks do not interleave in the log
        for rank in sorted(records):
            os.kill(records[rank]["pid"], signal.SIGUSR1)   # faulthandler: to stderr
            time.sleep(0.3)
    victim = records[kill_rank]
    os.kill(victim["pid"], signal.SIGKILL)
    return victim, time.time()


def torchrun_with_kill(script, args=(), folder=".", nproc: int = 2,
                       max_restarts: int = 3, kill_rank: int | None = 1,
                       pause_at: int | None = None, timeout: float = 180.0,
                       stacks: bool = True, env: dict | None = None,
                       runner: str = TORCHRUN) -> Run:
    """Run ``torchrun --standalone --max-restarts`` on ``script``; kill a rank once.

    With ``kill_rank`` and ``pause_at`` set, waits until every rank has paused at
    step ``pause_at`` (``pause_if_asked``), then kills ``kill_rank`` with SIGKILL.
    torchrun's output (all ranks) is in ``Run.log``; ``timeout`` bounds the whole run.
    ``runner``: ``TORCHRUN`` (the real one) or ``PRELOADED`` (ranks forked with torch
    imported; the same agent, restarts and environment).
    """
    script, folder = Path(script).resolve(), Path(folder)
    start, log_path = time.monotonic(), folder / "torchrun.log"
    from labkit import privacy   # here: scripts import this module in their ranks

    # Off the network where the OS allows (torchrun's stores bind every interface);
    # its logs and temp files in a folder removed at the end, not in a new
    # /tmp/torchelastic_* per run (nor among the run's snapshots in ``folder``).
    command, _fenced = privacy.loopback_only(
        _command(script, args, nproc, max_restarts, runner))
    private_folder = tempfile.mkdtemp(prefix="labkit-torchrun-")
    private = privacy.job_environment(private_folder)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=script.parent,
            start_new_session=True,
            env=_environment(script, pause_at if kill_rank is not None else None,
                             {**private, **(env or {})}))
    victim = kill_time = None
    timed_out = False
    try:
        if kill_rank is not None and pause_at is not None:
            restart = _wait_for_pause(folder, nproc, process, start + timeout)
            if restart is not None:
                victim, kill_time = _kill(folder, restart, kill_rank, stacks)
        process.wait(timeout=max(1.0, start + timeout - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:   # also on KeyboardInterrupt: nothing outlives the call
        _stop(process)
        shutil.rmtree(private_folder, ignore_errors=True)
    return Run(process.returncode, log_path.read_text(), starts(folder), victim,
               kill_time, time.monotonic() - start, timed_out)


def _stop(process, grace: float = 10.0) -> None:
    """Stop torchrun and its ranks (each rank runs in a session of its own)."""
    from labkit import _spawn   # here: scripts import this module inside their ranks

    _spawn.stop_tree(process, grace)   # SIGTERM first: torchrun stops its ranks
