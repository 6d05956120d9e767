"""Run a worker function on N ranks from a notebook, with guardrails instead of hangs.

Taught in: lab 03 (DistributedDataParallel); every multi-process lab after it calls
``run``. Scripts under ``torchrun`` call ``init_from_env`` and get the same context.

How a launch goes: small named pre-flight checks (worker importable, sizes sane,
backend possible), then the ranks start from a helper process that has already
imported torch (``forkserver``: never a fork of a process that touched CUDA), meet
through a TCP store on a loopback port the OS picked, run the worker, and send their result or
traceback back through a pipe. The parent prints; ranks stay quiet. Nothing of a
launch listens beyond loopback, and its files live in a private folder removed at
the end (``privacy``); on a machine a room shares, ``crowding`` says what a launch
may take.
"""

import contextlib
import datetime
import os
import pickle
import re
import signal
import socket
import sys
import tempfile
import time
from multiprocessing import connection

import torch.distributed as dist

from labkit import _forkserver, _spawn, crowding, hardware, privacy, scratch
from labkit._spawn import RankContext
from labkit.messages import N_, _

__all__ = ["RankContext", "LaunchError", "WorkerError", "CollectiveTimeout",
           "DeadlineExceeded", "run", "run_concurrently", "init_from_env", "warm_up"]

# Extra seconds the parent gives a rank's own collective timeout to fire first.
_GRACE_S = 3.0
# The whole launch may last this many collective timeouts unless told otherwise.
DEADLINE_TIMEOUTS = 20


class LaunchError(RuntimeError):
    """A launch could not start or did not finish; the message says what to do."""


class WorkerError(LaunchError):
    """A rank raised: ``rank`` and that rank's ``traceback`` text are attached."""

    def __init__(self, message: str, rank: int, traceback_text: str):
        super().__init__(message)
        self.rank, self.traceback = rank, traceback_text


class CollectiveTimeout(LaunchError):
    """Ranks waited past the timeout for others: ``ranks`` lists the unfinished ones."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


class DeadlineExceeded(LaunchError):
    """The whole launch outlived ``deadline``: ``ranks`` lists the unfinished ones."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


# ---------------------------------------------------------------- pre-flight checks

_MAIN_ADVICE = N_(   # translated where used: _(_MAIN_ADVICE).format(name=...)
    "Worker {name!r} is defined in the notebook (module __main__). Each rank is a "
    "fresh Python process that cannot see notebook cells, so it could not find it "
    "(the raw error would be: AttributeError: Can't get attribute {name!r} on "
    "<module '__main__'>). Move the function into a module: put it in a cell that "
    "starts with `%%writefile my_worker.py`, run that cell, then "
    "`from my_worker import {name}` and launch that.")


def _check_worker(worker) -> None:
    """Refuse workers the ranks could not import: notebook, lambda or nested ones."""
    name = getattr(worker, "__qualname__", repr(worker))
    module = getattr(worker, "__module__", None)
    if not callable(worker) or module is None:
        raise LaunchError(_("worker must be a function defined in a module, got "
                            "{worker!r}.").format(worker=worker))
    if module in ("__main__", "__mp_main__"):
        raise LaunchError(_(_MAIN_ADVICE).format(name=name))
    if "<" in name:
        raise LaunchError(_(
            "Worker {name!r} is a lambda or is defined inside another function: ranks "
            "can only import functions defined at the top level of a module.").format(
                name=name))
    try:
        found = _spawn.import_worker(module, name)
    except (ImportError, AttributeError) as err:
        raise LaunchError(_(
            "Ranks could not import worker {module}.{name}: {err}. Is the module's "
            "folder on sys.path (the notebook's folder is)?").format(
                module=module, name=name, err=err)) from err
    if found is not worker:
        raise LaunchError(_("{module}.{name} is not the function passed (the module was "
                            "edited or reloaded): import it again and pass the new "
                            "one.").format(module=module, name=name))


def _check_positive(name: str, value, kind=(int, float)) -> None:
    """Refuse a size or duration that is not a positive number."""
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        raise ValueError(_("{name} must be a positive number, got {value!r}.").format(
            name=name, value=value))


def _pickle_args(args: tuple) -> bytes:
    """Pickle the worker's arguments now, so a bad one fails before any rank starts."""
    try:
        return pickle.dumps(tuple(args))
    except Exception as err:  # pickle raises several types (PicklingError, TypeError)
        raise LaunchError(_(
            "The worker's args cannot be sent to the ranks ({err}): pass tensors, "
            "numbers, strings and containers of them.").format(err=err)) from err


# ---------------------------------------------------------------- reading the ranks

def _receive(rank: _spawn.Rank, index: int):
    """Return a rank's (kind, value) message, or raise if it died without one."""
    if rank.results.poll():
        try:
            return rank.results.recv()
        except EOFError:
            pass   # the pipe closed: the rank died while sending
    rank.process.join(1.0)
    code = rank.process.exitcode
    why = {-signal.SIGKILL: _(" (killed: out of memory?)"),
           -signal.SIGABRT: _(" (aborted by the backend: NCCL's watchdog aborts a rank "
                              "whose collective waited past the timeout; gloo aborts on "
                              "a message whose size does not match the receive buffer)")
           }.get(code, "")
    raise LaunchError(_(
        "Rank {index} exited with code {code}{why} before returning a result; the "
        "other ranks were stopped. Its own error went to its stderr. Launching from a "
        "script? Ranks re-import it: put the launch under "
        "`if __name__ == '__main__':`.").format(index=index, code=code, why=why))


def _rank_error(index: int, kind: str, text: str, finished: list[int],
                world_size: int, timeout: float) -> LaunchError:
    """Turn a rank's failure into WorkerError, or CollectiveTimeout on a timeout.

    ``kind`` was decided in the rank from the exception's type and origin
    (``_spawn.classify``), never from words that happen to be in the traceback.
    """
    if kind == "timeout":
        others = [r for r in range(world_size) if r not in finished and r != index]
        return CollectiveTimeout(_(
            "Rank {index} waited more than {timeout:g} s in a collective (finished "
            "ranks: {finished}, others still running: {others}). Every rank must call "
            "the same collectives in the same order, on tensors of the same shape. All "
            "ranks were stopped. Traceback of rank {index}:\n{text}").format(
                index=index, timeout=timeout, finished=finished or _("none"),
                others=others or _("none"), text=text) + crowding.overload_note(),
            [r for r in range(world_size) if r not in finished])
    last = text.strip().splitlines()[-1]
    hint = ""
    if "__mp_main__" in text or "<module '__main__'" in text:
        hint = _(" (something passed to or returned from the worker is defined in the "
                 "notebook: move it into a module too)")
    elif "Cannot re-initialize CUDA in forked subprocess" in text:
        hint = _(" (the process the ranks were forked from had initialised CUDA: set "
                 "os.environ['LABKIT_START_METHOD'] = 'spawn' and launch again)")
    return WorkerError(_("Rank {index} raised {last}{hint}. The other ranks were "
                         "stopped. Traceback of rank {index}:\n{text}").format(
                             index=index, last=last, hint=hint, text=text), index, text)


def _hang_error(finished: list[int], world_size: int,
                waited: float) -> CollectiveTimeout:
    """Say which ranks did not finish while others had (the parent's watchdog)."""
    stuck = [r for r in range(world_size) if r not in finished]
    return CollectiveTimeout(_(
        "Rank(s) {stuck} did not finish within {waited:g} s after rank(s) {finished} "
        "finished: most likely they wait in a collective the finished ranks never "
        "called (or they are stuck in a loop). All ranks were stopped. If a rank "
        "really works that much longer than the others, pass a larger timeout=.").format(
            stuck=stuck, waited=waited, finished=finished) + crowding.overload_note(), stuck)


def _peer_cause(ranks: list[_spawn.Rank], pending: list[int], index: int):
    """Return (rank, kind, message) of the pending rank whose failure closed rank
    ``index``'s connection, or None.

    A rank whose own collective timed out first sends its error and exits; its peers
    then see "Connection closed by peer". The cause is that rank's error (a timeout),
    not the peers' consequence. Waits up to 1 s for it; a rank that died without a
    message raises here (``_receive``).
    """
    others = {}
    for other in pending:
        if other != index:
            others[ranks[other].results] = others[ranks[other].process.sentinel] = other
    end = time.monotonic() + 1.0
    while others and time.monotonic() < end:
        for ready in connection.wait(list(others), timeout=max(0.0, end - time.monotonic())):
            other = others.get(ready)
            if other is None:
                continue   # its pipe and its sentinel were both ready
            others = {handle: r for handle, r in others.items() if r != other}
            kind, value = _receive(ranks[other], other)
            if kind not in ("ok", "peer_gone"):
                return other, kind, value
    return None


# ---------------------------------------------------------------- where each rank is

def _worker_frames(dump: str) -> list[str]:
    """Return the frames of the thread running the worker, innermost first.

    ``dump`` is faulthandler's text: one block per thread, "File "x.py", line N in f"
    lines, most recent call first. The worker's thread is the one in ``rank_main``.
    """
    for block in dump.split("\n\n"):
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
        if any(name == "rank_main" for *_frame, name in frames):
            return [f"{os.path.basename(path)}:{line} in {name}"
                    for path, line, name in frames
                    if name != "rank_main" and not path.endswith("_spawn.py")]
    return []


def _where(rank: _spawn.Rank) -> str:
    """Say where a running rank is: its innermost frame, and its worker's frames."""
    frames = _worker_frames(_spawn.stack_of(rank))
    if not frames:
        return _("(no stack: starting, or not in Python code)")
    return " <- ".join(frames[:4]) + (" <- ..." if len(frames) > 4 else "")


def _progress_line(ranks: list[_spawn.Rank], results: dict, seconds: float) -> str:
    """One line per rank: finished, or running and where (for the periodic report)."""
    lines = [_("[launch] still running after {seconds:.0f} s:").format(seconds=seconds)]
    for index, rank in enumerate(ranks):
        state = (_("finished") if index in results
                 else _("running, at {where}").format(where=_where(rank)))
        lines.append(f"  rank {index}: {state}")
    return "\n".join(lines)


def _deadline_error(ranks: list[_spawn.Rank], results: dict,
                    deadline: float) -> DeadlineExceeded:
    """Name the unfinished ranks and where each one is, at the overall deadline."""
    stuck = [i for i in range(len(ranks)) if i not in results]
    where = "\n".join(f"  rank {i}: " + _("at {where}").format(where=_where(ranks[i]))
                      for i in stuck)
    return DeadlineExceeded(_(
        "The launch ran past its deadline of {deadline:g} s; rank(s) {stuck} had not "
        "finished (finished: {finished}). Where each one was:\n{where}\nA loop that "
        "never ends, or a rank waiting on something no other rank sends, looks like "
        "this. All ranks were stopped. If the work really takes longer, pass a larger "
        "deadline=.").format(deadline=deadline, stuck=stuck,
                             finished=sorted(results) or _("none"), where=where)
        + crowding.overload_note(), stuck)


# ---------------------------------------------------------------- the launch

def _collect(jobs: list[list[_spawn.Rank]], timeout: float, deadline: float,
             report_every: float) -> tuple[list, list]:
    """Wait for every rank's result in every job; raise at the first error, a hang or
    the deadline, whichever job it is in (the error carries ``job``, its index).

    Returns each job's results in rank order, and the time each job finished. Every
    ``report_every`` seconds it prints where the unfinished ranks are.
    """
    results, first_done = [{} for _ in jobs], [None] * len(jobs)
    finished_at = [None] * len(jobs)
    start = time.monotonic()
    next_report, waited = start + report_every, timeout + _GRACE_S
    while None in finished_at:
        now = time.monotonic()
        running = [job for job, done in enumerate(finished_at) if done is None]
        for job in running:
            ranks, found = jobs[job], results[job]
            if first_done[job] is not None and now >= first_done[job] + waited:
                raise _in_job(_hang_error(sorted(found), len(ranks), waited), job)
            if now >= start + deadline:
                raise _in_job(_deadline_error(ranks, found, deadline), job)
        if now >= next_report:
            for job in running:
                print(_progress_line(jobs[job], results[job], now - start), flush=True)
            next_report += report_every
        wake = min([next_report, start + deadline]
                   + [first_done[job] + waited for job in running
                      if first_done[job] is not None])
        handles = {}
        for job in running:
            for index, rank in enumerate(jobs[job]):
                if index not in results[job]:
                    handles[rank.results] = handles[rank.process.sentinel] = (job, index)
        for ready in connection.wait(list(handles), timeout=max(0.0, wake - now)):
            job, index = handles[ready]
            ranks, found = jobs[job], results[job]
            if index in found:
                continue   # its pipe and its sentinel were both ready
            try:
                kind, value = _receive(ranks[index], index)
                if kind == "peer_gone":   # report the rank that left, if it says why
                    pending = [i for i in range(len(ranks)) if i not in found]
                    index, kind, value = _peer_cause(ranks, pending, index) or (
                        index, kind, value)
            except LaunchError as err:
                raise _in_job(err, job)
            if kind != "ok":
                raise _in_job(_rank_error(index, kind, value, sorted(found), len(ranks),
                                          timeout), job)
            found[index] = value
            first_done[job] = first_done[job] or time.monotonic()
            if len(found) == len(ranks):
                finished_at[job] = time.perf_counter()
    return ([[found[i] for i in range(len(ranks))] for ranks, found in zip(jobs, results)],
            finished_at)


def _in_job(err: LaunchError, job: int) -> LaunchError:
    """Tag a launch error with the index of the job it happened in."""
    err.job = job
    return err


def _choose(world_size: int, backend: str) -> hardware.Setup:
    """Choose this job's backend and print it, with a note if it is not the lab's.

    "auto" decides by the job's size: NCCL only with at least ``world_size`` GPUs.
    So on a 1-GPU machine a 1-rank job takes the GPU while a 2-rank job runs on CPU
    ranks; a lab that compares them passes its one backend (``setup.backend``).
    """
    setup = hardware.choose(world_size, backend, verbose=False)   # raises if impossible
    print(hardware.backend_line(setup))
    lab = hardware.lab_setup()
    if backend == "auto" and lab is not None and lab.backend != setup.backend:
        print(_("Note: this lab set up {lab_backend} on {lab_device} ({lab_n} rank(s)), "
                "but this {n}-rank job chose {backend} by its size. Jobs whose numbers "
                "are compared should share one backend: pass backend=setup.backend.")
              .format(lab_backend=lab.backend, lab_device=lab.device_type,
                      lab_n=lab.world_size, n=world_size, backend=setup.backend))
    return setup


def run(worker, world_size: int = 2, args: tuple = (), backend: str = "auto",
        timeout: float = 60.0, threads_per_rank: int = 1, deadline: float | None = None,
        report_every: float = 20.0, allow_oversubscription: bool = False) -> list:
    """Run ``worker(ctx, *args)`` on ``world_size`` ranks; return each rank's result.

    The process group is up when ``worker`` starts and torn down after it returns.
    ``backend``: "auto" (NCCL with one GPU per rank when there are ``world_size``
    GPUs, else gloo on CPU ranks; printed), "nccl" or "gloo"; a lab passes the one
    its setup chose, ``backend=setup.backend``, so that all its jobs share it.
    ``timeout`` (s) bounds each collective, and how long the last rank may run after
    the first one finished. ``deadline`` (s, default 20 x timeout) bounds the whole
    launch; every ``report_every`` s a line says where each unfinished rank is. Each
    rank, CPU or GPU, gets ``threads_per_rank`` CPU threads. A launch this machine
    cannot hold is refused unless ``allow_oversubscription``; one past the learner's
    caps (``LABKIT_MAX_RANKS``, ``LABKIT_MAX_THREADS``, set by a hub) always is.
    """
    return run_concurrently([(worker, world_size, args)], backend, timeout,
                            threads_per_rank, deadline, report_every,
                            allow_oversubscription)[0]


def run_concurrently(jobs: list, backend: str = "auto", timeout: float = 60.0,
                     threads_per_rank: int = 1, deadline: float | None = None,
                     report_every: float = 20.0,
                     allow_oversubscription: bool = False) -> list:
    """Run several independent jobs at once, ``(worker, world_size, args)`` each: one
    process group per job; return each job's list of rank results, in order.

    Taught in: lab 10, whose check runs eight layouts of the learner's Trainer a few
    at a time (a machine's cores are busy with 8 ranks, not with 1 or 2). The options
    are ``run``'s, for every job; the guards count all the jobs' ranks together. The
    first failure stops every job and is raised with ``job`` (its index) attached.
    """
    deadline = DEADLINE_TIMEOUTS * timeout if deadline is None else deadline
    for name, value, kind in (("timeout", timeout, (int, float)),
                              ("threads_per_rank", threads_per_rank, int),
                              ("deadline", deadline, (int, float)),
                              ("report_every", report_every, (int, float))):
        _check_positive(name, value, kind)
    for worker, _world_size, _args in jobs:
        _check_worker(worker)
    payloads = [_pickle_args(args) for _w, _n, args in jobs]
    setups = [_choose(world_size, backend) for _w, world_size, _a in jobs]
    try:
        crowding.check_launch(sum(world_size for _w, world_size, _a in jobs),
                              threads_per_rank, setups[0].device_type,
                              allow_oversubscription)
    except crowding.LaunchRefused as refused:
        raise LaunchError(str(refused)) from None
    with contextlib.ExitStack() as stack:   # also on KeyboardInterrupt: no rank
        started = [stack.enter_context(   # outlives the call, in any job
            _started(worker, setup, payload, timeout, threads_per_rank))
            for (worker, _n, _a), setup, payload in zip(jobs, setups, payloads)]
        results, finished_at = _collect([ranks for _n, _s, ranks in started], timeout,
                                         deadline, report_every)
        for (name, start, ranks), end in zip(started, finished_at):
            print(_("{n} rank(s) of {name} finished in {seconds:.1f} s").format(
                n=len(ranks), name=name, seconds=end - start))
            _spawn.stop(ranks, finished=True)   # each job's ranks wait to be released
    return results


@contextlib.contextmanager
def _started(worker, setup: hardware.Setup, payload: bytes, timeout: float,
             threads_per_rank: int):
    """Start one job's ranks; yield (name, start time, ranks); stop them at the end."""
    store = _loopback_store(setup.world_size, timeout)
    name = f"{worker.__module__}.{worker.__qualname__}"
    hardware.record_choice("launch", setup, name)
    print(_("Launching {n} rank(s) of {name} ({backend}, rendezvous on "
            "127.0.0.1:{port}, loopback only)").format(
                n=setup.world_size, name=name, backend=setup.backend, port=store.port))
    start, ranks, finished = time.perf_counter(), [], False
    # The launch's private folder (0700): rank stacks, and the ranks' TMPDIR and
    # compile cache, all removed when the launch ends (in the kernel's scratch
    # folder: removed with it if the kernel is killed meanwhile).
    with tempfile.TemporaryDirectory(prefix="labkit-launch-",
                                     dir=scratch.folder()) as folder, \
            crowding.claim(setup.world_size, threads_per_rank), _forkserver.in_use():
        spec = _spawn.RankSpec(worker.__module__, worker.__qualname__, payload, setup,
                               store.port, float(timeout), threads_per_rank,
                               _rank_environment(folder), folder)
        try:
            for rank in range(setup.world_size):
                ranks.append(_spawn.start_rank(spec, rank))
            yield name, start, ranks
            finished = True
        finally:   # released by the caller when all finished, else stopped here
            if not finished:
                _spawn.stop(ranks, finished=False)


def _loopback_store(world_size: int, timeout: float) -> dist.TCPStore:
    """The launch's rendezvous: a TCPStore that listens on 127.0.0.1 only.

    Given a host and a port, TCPStore's server listens on every interface ("::")
    whatever the host; on a classroom server anyone who reaches the machine could
    then join a learner's job. A socket bound to loopback first, handed over as
    ``master_listen_fd``, keeps it off the network (the OS still picks the port).
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(max(128, world_size))
        store = dist.TCPStore("127.0.0.1", listener.getsockname()[1], world_size,
                              is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout),
                              master_listen_fd=listener.fileno())
    except BaseException:
        listener.close()
        raise
    listener.detach()   # the store owns the socket now, and closes it
    return store


def _rank_environment(folder: str) -> dict:
    """The ranks' environment: this process's, with the learner's language fixed in it
    (a rank started from labs/zh_CN/ speaks Chinese wherever its working folder is),
    its temp files in the launch's ``folder`` and its sockets on loopback."""
    from labkit.messages import language

    return {**os.environ, "LABKIT_LANG": language(), **privacy.job_environment(folder)}


def warm_up() -> None:
    """Start the helper that preloads torch now, in the background (``run`` would).

    Call it in a lab's setup cell: the first launch then finds torch imported. The
    helper stops by itself after 15 minutes without a launch (``LABKIT_HELPER_IDLE_S``).
    """
    _forkserver.start()


def _env_int(name: str) -> int:
    """Read an integer that torchrun sets, with advice when it is missing."""
    if name not in os.environ:
        raise LaunchError(_(
            "Environment variable {name} is not set: start this script with torchrun "
            "(e.g. `torchrun --nproc-per-node=2 script.py`), or call "
            "launch.run(worker, world_size) from a notebook.").format(name=name))
    return int(os.environ[name])


def init_from_env(backend: str = "auto", timeout: float = 60.0,
                  threads_per_rank: int | None = None) -> RankContext:
    """Join the process group torchrun describes (env://); return this rank's context.

    "auto" chooses one backend for the whole job, from the node's size: NCCL only when
    the node has a GPU for each of its ``LOCAL_WORLD_SIZE`` ranks, else gloo on CPU
    ranks; rank 0 prints it. On NCCL the group is bound to the rank's GPU
    (``device_id``). ``threads_per_rank`` caps each rank's CPU threads, GPU ranks
    included; ``None`` keeps torch's (torchrun sets OMP_NUM_THREADS=1).
    """
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK")
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    setup = hardware.choose(local_world_size, backend, verbose=rank == 0)
    device = setup.device(local_rank)
    _spawn.pin_device(device, threads_per_rank)
    _spawn.init_group(setup.backend, device, init_method="env://", rank=rank,
                      world_size=world_size,
                      timeout=datetime.timedelta(seconds=timeout))
    if rank == 0:
        hardware.record_choice("init_from_env", setup, os.path.basename(sys.argv[0]))
    return RankContext(rank, world_size, local_rank, setup.backend, device)
