"""Start, watch and stop the rank processes behind ``launch.run`` (the plumbing).

Ranks are started by a ``forkserver``: one helper process that imports torch once and
forks a fresh rank per request. It never touches CUDA, so its forks are CUDA-safe,
and it lives until the Python that started it exits. Each rank gets two pipes: one
for its result (or traceback), one on which the parent releases it when all are done.
"""

import datetime
import importlib
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing import connection

import torch
import torch.distributed as dist

from labkit import hardware

__all__ = ["RankContext", "RankSpec", "Rank", "import_worker", "start_rank", "stop",
           "start_server"]

# Imported once by the forkserver, so each rank starts with them already loaded.
# torch._dynamo is what the first DistributedDataParallel(...) imports (about 2-3 s
# per rank per launch otherwise); importing it leaves the server single-threaded.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "labkit.launch"]
STOP_S = 5.0   # seconds a rank gets to exit before it is killed


@dataclass(frozen=True)
class RankContext:
    """What a rank knows about itself: pass it to the worker as its first argument."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs, sent to it at start (picklable, no live objects)."""

    module: str
    qualname: str
    args: bytes
    setup: hardware.Setup
    port: int
    timeout: float
    threads_per_rank: int
    environ: dict


def import_worker(module: str, qualname: str):
    """Import ``module`` and return the object named ``qualname`` in it."""
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


# ---------------------------------------------------------------- inside each rank

def watch_parent(control) -> threading.Event:
    """Return an event set when the parent releases this rank; exit if it dies."""
    released = threading.Event()

    def watch():
        try:
            control.recv()
        except (EOFError, OSError):
            os._exit(1)   # the parent is gone: never outlive it
        released.set()

    threading.Thread(target=watch, daemon=True).start()
    return released


def init_rank(spec: RankSpec, rank: int) -> RankContext:
    """Pin the device, join the store and bring the default process group up."""
    device = spec.setup.device(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(spec.threads_per_rank)
    timeout = datetime.timedelta(seconds=spec.timeout)
    store = dist.TCPStore("127.0.0.1", spec.port, spec.setup.world_size,
                          is_master=False, timeout=timeout)
    dist.init_process_group(spec.setup.backend, store=store, rank=rank,
                            world_size=spec.setup.world_size, timeout=timeout)
    return RankContext(rank, spec.setup.world_size, rank, spec.setup.backend, device)


def send_by_value(results, message) -> None:
    """Send with plain pickle: tensors go as bytes, not as handles that die with us."""
    results.send_bytes(pickle.dumps(message))


def rank_main(spec: RankSpec, rank: int, results, control) -> None:
    """Run one rank: send ("ok", result) or ("error", traceback), wait for release."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent decides when ranks stop
    os.environ.clear()
    os.environ.update(spec.environ)   # the parent's environment now, not the server's
    released = watch_parent(control)
    try:
        worker = import_worker(spec.module, spec.qualname)
        ctx = init_rank(spec, rank)
        send_by_value(results, ("ok", worker(ctx, *pickle.loads(spec.args))))
    except BaseException as err:   # KeyboardInterrupt and SystemExit included
        frames = err.__traceback__.tb_next   # skip this launcher frame
        text = "".join(traceback.format_exception(type(err), err, frames))
        send_by_value(results, ("error", text))
    released.wait()   # keep the process group up until every rank is done
    if dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------- in the parent

def _context():
    """Return a start method safe with CUDA: forkserver (preloaded), else spawn.

    ``LABKIT_START_METHOD=spawn`` forces a fresh interpreter per rank (slower).
    """
    method = os.environ.get("LABKIT_START_METHOD", "forkserver")
    if method not in mp.get_all_start_methods() or method == "fork":
        method = "spawn"   # never fork the notebook: it may have touched CUDA
    context = mp.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(PRELOAD)
    return context


def start_server() -> None:
    """Start the forkserver now; it imports ``PRELOAD`` in the background."""
    context = _context()
    if context.get_start_method() == "forkserver":
        from multiprocessing import forkserver
        forkserver.ensure_running()


@dataclass
class Rank:
    """The parent's handles on one rank."""

    process: mp.process.BaseProcess
    results: connection.Connection
    control: connection.Connection


def start_rank(spec: RankSpec, rank: int) -> Rank:
    """Start one rank, with a pipe for its result and one to release it."""
    context = _context()
    results_in, results_out = context.Pipe(duplex=False)
    control_in, control_out = context.Pipe(duplex=False)
    process = context.Process(target=rank_main, name=f"labkit-rank-{rank}",
                              args=(spec, rank, results_out, control_in), daemon=True)
    process.start()
    results_out.close()   # the parent keeps only its own ends: EOF means "rank gone"
    control_in.close()
    return Rank(process, results_in, control_out)


def stop(ranks: list[Rank], finished: bool) -> None:
    """Release the ranks if all finished, else terminate them; kill any that lingers."""
    deadline = time.monotonic() + STOP_S
    try:
        for rank in ranks:
            if finished:
                send_quietly(rank.control, "exit")
            else:
                rank.process.terminate()
        for rank in ranks:
            rank.process.join(max(0.0, deadline - time.monotonic()))
    finally:   # even if interrupted again while waiting
        for rank in ranks:
            if rank.process.is_alive():
                rank.process.kill()   # SIGTERM ignored or too slow
                rank.process.join()
            rank.results.close()
            rank.control.close()


def send_quietly(pipe: connection.Connection, message) -> None:
    """Send ``message`` unless the other end is already gone."""
    try:
        pipe.send(message)
    except OSError:
        pass
