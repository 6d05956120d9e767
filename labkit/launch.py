"""Run a worker function on N ranks from a notebook, with guardrails instead of hangs.

Taught in: lab 03 (DistributedDataParallel); every multi-process lab after it calls
``run``. Scripts under ``torchrun`` call ``init_from_env`` and get the same context.

How a launch goes: small named pre-flight checks (worker importable, sizes sane,
backend possible), then the ranks start from a helper process that has already
imported torch (``forkserver``: never a fork of a process that touched CUDA), meet
through a TCP store on a port the OS picked, run the worker, and send their result or
traceback back through a pipe. The parent prints; ranks stay quiet.
"""

import datetime
import os
import pickle
import signal
import time
from multiprocessing import connection

import torch
import torch.distributed as dist

from labkit import _spawn, hardware
from labkit._spawn import RankContext

__all__ = ["RankContext", "LaunchError", "WorkerError", "CollectiveTimeout",
           "run", "init_from_env", "warm_up"]

# Extra seconds the parent gives a rank's own collective timeout to fire first.
_GRACE_S = 3.0


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


# ---------------------------------------------------------------- pre-flight checks

_MAIN_ADVICE = (
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
        raise LaunchError(
            f"worker must be a function defined in a module, got {worker!r}.")
    if module in ("__main__", "__mp_main__"):
        raise LaunchError(_MAIN_ADVICE.format(name=name))
    if "<" in name:
        raise LaunchError(
            f"Worker {name!r} is a lambda or is defined inside another function: ranks "
            "can only import functions defined at the top level of a module.")
    try:
        found = _spawn.import_worker(module, name)
    except (ImportError, AttributeError) as err:
        raise LaunchError(
            f"Ranks could not import worker {module}.{name}: {err}. Is the module's "
            "folder on sys.path (the notebook's folder is)?") from err
    if found is not worker:
        raise LaunchError(f"{module}.{name} is not the function passed (the module was "
                          "edited or reloaded): import it again and pass the new one.")


def _check_positive(name: str, value, kind=(int, float)) -> None:
    """Refuse a size or duration that is not a positive number."""
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}.")


def _pickle_args(args: tuple) -> bytes:
    """Pickle the worker's arguments now, so a bad one fails before any rank starts."""
    try:
        return pickle.dumps(tuple(args))
    except Exception as err:  # pickle raises several types (PicklingError, TypeError)
        raise LaunchError(
            f"The worker's args cannot be sent to the ranks ({err}): pass tensors, "
            "numbers, strings and containers of them.") from err


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
    why = {-signal.SIGKILL: " (killed: out of memory?)",
           -signal.SIGABRT: " (aborted: NCCL's watchdog aborts a rank whose collective "
                            "waited past the timeout)"}.get(code, "")
    raise LaunchError(
        f"Rank {index} exited with code {code}{why} before returning a result; the "
        "other ranks were stopped. Its own error went to its stderr. Launching from a "
        "script? Ranks re-import it: put the launch under "
        "`if __name__ == '__main__':`.")


def _looks_like_timeout(text: str) -> bool:
    """Tell whether a rank's traceback is a collective or rendezvous timeout."""
    return any(mark in text for mark in ("Timed out", "timed out", "DistStoreError"))


def _rank_error(index: int, text: str, finished: list[int], world_size: int,
                timeout: float) -> LaunchError:
    """Turn a rank's traceback into WorkerError, or CollectiveTimeout on a timeout."""
    if _looks_like_timeout(text):
        others = [r for r in range(world_size) if r not in finished and r != index]
        return CollectiveTimeout(
            f"Rank {index} waited more than {timeout:g} s in a collective (finished "
            f"ranks: {finished or 'none'}, others still running: {others or 'none'}). "
            "Every rank must call the same collectives in the same order, on tensors "
            f"of the same shape. All ranks were stopped. Traceback of rank {index}:\n"
            f"{text}",
            [r for r in range(world_size) if r not in finished])
    last = text.strip().splitlines()[-1]
    hint = ""
    if "__mp_main__" in text or "<module '__main__'" in text:
        hint = (" (something passed to or returned from the worker is defined in the "
                "notebook: move it into a module too)")
    elif "Cannot re-initialize CUDA in forked subprocess" in text:
        hint = (" (the process the ranks were forked from had initialised CUDA: set "
                "os.environ['LABKIT_START_METHOD'] = 'spawn' and launch again)")
    return WorkerError(f"Rank {index} raised {last}{hint}. The other ranks were "
                       f"stopped. Traceback of rank {index}:\n{text}", index, text)


def _hang_error(finished: list[int], world_size: int,
                waited: float) -> CollectiveTimeout:
    """Say which ranks did not finish while others had (the parent's watchdog)."""
    stuck = [r for r in range(world_size) if r not in finished]
    return CollectiveTimeout(
        f"Rank(s) {stuck} did not finish within {waited:g} s after rank(s) {finished} "
        "finished: most likely they wait in a collective the finished ranks never "
        "called (or they are stuck in a loop). All ranks were stopped. If a rank "
        "really works that much longer than the others, pass a larger timeout=.", stuck)


def _dead_peer(ranks: list[_spawn.Rank], pending: list[int], index: int):
    """Return a pending rank, other than ``index``, that has died."""
    for other in pending:
        if other == index:
            continue
        ranks[other].process.join(1.0)   # its death may be why rank ``index`` failed
        if ranks[other].process.exitcode is not None:
            return other
    return None


def _collect(ranks: list[_spawn.Rank], timeout: float) -> list:
    """Wait for every rank's result; raise at the first error or when ranks hang."""
    results, first_done = {}, None
    while len(results) < len(ranks):
        waited = timeout + _GRACE_S
        left = None if first_done is None else first_done + waited - time.monotonic()
        if left is not None and left <= 0:
            raise _hang_error(sorted(results), len(ranks), waited)
        pending = [i for i in range(len(ranks)) if i not in results]
        handles = {ranks[i].results: i for i in pending}
        handles.update({ranks[i].process.sentinel: i for i in pending})
        for ready in connection.wait(list(handles), timeout=left):
            index = handles[ready]
            if index in results:
                continue   # its pipe and its sentinel were both ready
            kind, value = _receive(ranks[index], index)
            if kind == "error" and "Connection closed by peer" in value:
                dead = _dead_peer(ranks, pending, index)
                if dead is not None:
                    _receive(ranks[dead], dead)   # raises unless it left a message
            if kind == "error":
                raise _rank_error(index, value, sorted(results), len(ranks), timeout)
            results[index] = value
            first_done = first_done or time.monotonic()
    return [results[i] for i in range(len(ranks))]


def run(worker, world_size: int = 2, args: tuple = (), backend: str = "auto",
        timeout: float = 60.0, threads_per_rank: int = 1) -> list:
    """Run ``worker(ctx, *args)`` on ``world_size`` ranks; return each rank's result.

    The process group is up when ``worker`` starts and torn down after it returns.
    ``timeout`` (s) bounds each collective, and how long the last rank may run after
    the first one finished. CPU ranks get ``threads_per_rank`` threads each.
    """
    _check_worker(worker)
    _check_positive("timeout", timeout)
    _check_positive("threads_per_rank", threads_per_rank, int)
    payload = _pickle_args(args)
    setup = hardware.choose(world_size, backend)   # prints why; raises if impossible
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                          wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    name = f"{worker.__module__}.{worker.__qualname__}"
    spec = _spawn.RankSpec(worker.__module__, worker.__qualname__, payload, setup,
                           store.port, float(timeout), threads_per_rank,
                           dict(os.environ))
    print(f"Launching {world_size} rank(s) of {name} ({setup.backend}, rendezvous on "
          f"127.0.0.1:{store.port})")
    start, ranks, results = time.perf_counter(), [], None
    try:
        for rank in range(world_size):
            ranks.append(_spawn.start_rank(spec, rank))
        results = _collect(ranks, timeout)
    finally:   # also on KeyboardInterrupt: no rank outlives the call
        _spawn.stop(ranks, finished=results is not None)
    print(f"{world_size} rank(s) of {name} finished in "
          f"{time.perf_counter() - start:.1f} s")
    return results


def warm_up() -> None:
    """Start the helper that preloads torch now, in the background (``run`` would).

    Call it in a lab's setup cell: the first launch then finds torch imported.
    """
    _spawn.start_server()


def _env_int(name: str) -> int:
    """Read an integer that torchrun sets, with advice when it is missing."""
    if name not in os.environ:
        raise LaunchError(
            f"Environment variable {name} is not set: start this script with torchrun "
            "(e.g. `torchrun --nproc-per-node=2 script.py`), or call "
            "launch.run(worker, world_size) from a notebook.")
    return int(os.environ[name])


def init_from_env(backend: str = "auto", timeout: float = 60.0,
                  threads_per_rank: int | None = None) -> RankContext:
    """Join the process group torchrun describes (env://); return this rank's context.

    The backend is chosen per node (one GPU per local rank, else gloo) and printed by
    rank 0. ``threads_per_rank=None`` keeps torch's (torchrun sets OMP_NUM_THREADS=1).
    """
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK")
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    setup = hardware.choose(local_world_size, backend, verbose=rank == 0)
    device = setup.device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif threads_per_rank is not None:
        torch.set_num_threads(threads_per_rank)
    dist.init_process_group(setup.backend, init_method="env://", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    return RankContext(rank, world_size, local_rank, setup.backend, device)
