"""Start, watch and stop the rank processes behind ``launch.run`` (the plumbing).

Ranks are started by a ``forkserver`` (``_forkserver``): one helper process that
imports torch once and forks a fresh rank per request. It never touches CUDA, so its
forks are CUDA-safe. Each rank gets two pipes: one for its result (or traceback), one
on which the parent releases it when all are done.

Ranks are *not* daemonic, so a worker may start children of its own (``DataLoader``
workers). In exchange, nothing a rank starts may outlive it: ``stop`` ends each rank's
whole process tree, and a rank whose parent dies ends its children before exiting.
Each rank also dumps its Python stacks to a file when sent ``SIGUSR1`` (``faulthandler``),
which is how the parent can say where a slow or stuck rank is.
"""

import datetime
import faulthandler
import importlib
import io
import multiprocessing
import os
import pickle
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing import connection

import psutil
import torch
import torch.distributed as dist

from labkit import _forkserver, hardware
from labkit.messages import _

__all__ = ["RankContext", "RankSpec", "Rank", "RANK_ENV", "import_worker",
           "classify", "start_rank", "stop", "stack_of", "descendants", "kill_all",
           "stop_tree", "pin_device", "init_group"]

STOP_S = 5.0   # seconds a rank gets to exit before it is killed
RANK_ENV = "LABKIT_RANK"   # set inside every launched rank (labkit.data reads it)
STACK_SIGNAL = signal.SIGUSR1
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


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
    stack_folder: str   # each rank dumps its stacks to rank<N>.stacks in it


def import_worker(module: str, qualname: str):
    """Import ``module`` and return the object named ``qualname`` in it."""
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def classify(err: BaseException) -> str:
    """Say what kind of failure ``err`` is, from its type and where it was raised.

    "timeout": a rendezvous or collective waited past its timeout (``DistStoreError``,
    or torch.distributed's own timeout error); "peer_gone": another rank's connection
    closed under this one; "error": anything else, whatever its text says.
    """
    if isinstance(err, dist.DistStoreError):
        return "timeout"
    frames = traceback.extract_tb(err.__traceback__)
    # Raised inside torch (a collective, or DDP's all-reduce inside autograd's engine),
    # not by the worker's own code, whatever words the worker's message might use.
    raised_by_torch = bool(frames) and frames[-1].filename.startswith(TORCH_DIR)
    if raised_by_torch and type(err) in (RuntimeError, dist.DistBackendError,
                                         dist.DistNetworkError):
        text = str(err)
        if "Timed out" in text or "timed out" in text:   # gloo, NCCL, store
            return "timeout"
        if "Connection closed by peer" in text or "Connection reset by peer" in text:
            return "peer_gone"
    return "error"


# ---------------------------------------------------------------- inside each rank

def descendants(pid: int) -> list[psutil.Process]:
    """Return every live process below ``pid`` (none if it is already gone)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except (psutil.Error, TypeError):   # gone, or never started (pid None)
        return []


def kill_all(processes: list[psutil.Process]) -> None:
    """SIGKILL each process that is still there."""
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass


def stop_tree(process, grace: float = 0.0) -> None:
    """Stop a ``subprocess.Popen`` and every process below it, in any session.

    torchrun starts each rank in a session of its own, so killing torchrun's process
    group would leave the ranks running: their pids are read before anything dies.
    With ``grace`` > 0 the process first gets SIGTERM (torchrun then stops its ranks).
    """
    below = descendants(process.pid)
    if process.poll() is None:
        if grace > 0:
            process.terminate()
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        process.kill()
        process.wait()
    kill_all(below)


def _end_children() -> None:
    """Kill every process this one started (DataLoader workers), before we go."""
    kill_all(descendants(os.getpid()))


def watch_parent(control) -> threading.Event:
    """Return an event set when the parent releases this rank; exit if it dies."""
    released = threading.Event()

    def watch():
        try:
            control.recv()
        except (EOFError, OSError):
            _end_children()
            os._exit(1)   # the parent is gone: never outlive it
        released.set()

    threading.Thread(target=watch, daemon=True).start()
    return released


def pin_device(device: torch.device, threads: int | None) -> None:
    """Give this rank its CPU threads and, on NCCL, its own GPU (before any CUDA use).

    GPU ranks are capped too: each still runs CPU work (data, the optimizer's Python,
    NCCL's proxy threads), and N ranks with all cores each would fight over them.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)


def init_group(backend: str, device: torch.device, **kwargs) -> None:
    """``init_process_group``, bound to this rank's GPU on NCCL (``device_id``).

    With ``device_id`` NCCL knows each rank's GPU from the start: it creates its
    communicator at once (an error shows here, not in the first collective), and
    ``barrier`` no longer has to guess which GPU a rank uses.
    """
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(backend, **kwargs)


def init_rank(spec: RankSpec, rank: int) -> RankContext:
    """Pin the threads and the device, join the store, bring the process group up."""
    device = spec.setup.device(rank)
    if device.type == "cuda" and torch.cuda.is_initialized():
        raise RuntimeError(_(   # inherited from the process this rank was forked from
            "CUDA was already initialised in this rank before it chose its GPU: the "
            "process it was forked from had used CUDA. Set "
            "os.environ['LABKIT_START_METHOD'] = 'spawn' and launch again."))
    pin_device(device, spec.threads_per_rank)
    timeout = datetime.timedelta(seconds=spec.timeout)
    store = dist.TCPStore("127.0.0.1", spec.port, spec.setup.world_size,
                          is_master=False, timeout=timeout)
    init_group(spec.setup.backend, device, store=store, rank=rank,
               world_size=spec.setup.world_size, timeout=timeout)
    return RankContext(rank, spec.setup.world_size, rank, spec.setup.backend, device)


def _tensor_from_bytes(dtype: torch.dtype, shape: tuple, data: bytes) -> torch.Tensor:
    """Rebuild a CPU tensor that ``_ByValue`` sent as its raw bytes."""
    if not data:   # frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


class _ByValue(pickle.Pickler):
    """Plain pickle, with a plain CPU tensor sent as dtype, shape and raw bytes.

    Plain pickle sends each tensor's storage through ``torch.save`` (about 0.1 ms a
    tensor each way): lab 10's check gets some 2,600 tensors back from 27 ranks.
    Anything else (a Parameter, a DTensor, a GPU or sparse tensor, one that needs
    grad) goes the plain way.
    """

    def reducer_override(self, obj):
        if (type(obj) is torch.Tensor and obj.layout == torch.strided
                and obj.device.type == "cpu" and not obj.requires_grad
                and not obj.is_quantized):
            flat = obj.resolve_conj().resolve_neg().contiguous().reshape(-1)
            return _tensor_from_bytes, (obj.dtype, tuple(obj.shape),
                                        flat.view(torch.uint8).numpy().tobytes())
        return NotImplemented


def send_by_value(results, message) -> None:
    """Send with pickle by value: tensors go as bytes, not as handles that die with
    us (``_ByValue``)."""
    buffer = io.BytesIO()
    _ByValue(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
    results.send_bytes(buffer.getbuffer())


def rank_main(spec: RankSpec, rank: int, results, control) -> None:
    """Run one rank: send ("ok", result) or (kind, traceback); wait for release."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent decides when ranks stop
    os.environ.clear()
    os.environ.update(spec.environ)   # the parent's environment now, not the server's
    os.environ[RANK_ENV] = str(rank)
    tempfile.tempdir = None   # read TMPDIR again: this launch's folder, not the helper's
    # torch read TORCH_DISTRIBUTED_DEBUG when the forkserver imported it: read it again
    dist.set_debug_level_from_env()
    stacks = open(os.path.join(spec.stack_folder, f"rank{rank}.stacks"), "w")
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)
    released = watch_parent(control)
    try:
        worker = import_worker(spec.module, spec.qualname)
        ctx = init_rank(spec, rank)
        send_by_value(results, ("ok", worker(ctx, *pickle.loads(spec.args))))
    except BaseException as err:   # KeyboardInterrupt and SystemExit included
        frames = err.__traceback__.tb_next   # skip this launcher frame
        text = "".join(traceback.format_exception(type(err), err, frames))
        send_by_value(results, (classify(err), text))
    released.wait()   # keep the process group up until every rank is done
    if dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------- in the parent

@dataclass
class Rank:
    """The parent's handles on one rank."""

    process: multiprocessing.process.BaseProcess
    results: connection.Connection
    control: connection.Connection
    stacks: str   # the file its stack dumps go to


def start_rank(spec: RankSpec, rank: int) -> Rank:
    """Start one rank, with a pipe for its result and one to release it."""
    _forkserver.start()   # already running: returns at once
    context = _forkserver.context()
    results_in, results_out = context.Pipe(duplex=False)
    control_in, control_out = context.Pipe(duplex=False)
    # Not daemonic: a rank may start DataLoader workers (daemonic processes may not
    # have children). ``stop`` and the rank itself make sure none is left behind.
    process = context.Process(target=rank_main, name=f"labkit-rank-{rank}",
                              args=(spec, rank, results_out, control_in), daemon=False)
    process.start()
    results_out.close()   # the parent keeps only its own ends: EOF means "rank gone"
    control_in.close()
    stacks = os.path.join(spec.stack_folder, f"rank{rank}.stacks")
    return Rank(process, results_in, control_out, stacks)


def stop(ranks: list[Rank], finished: bool) -> None:
    """Release the ranks if all finished, else terminate them; kill what lingers.

    Whatever the ranks started (DataLoader workers) is ended too: nothing outlives
    the launch.
    """
    deadline = time.monotonic() + STOP_S
    below = [p for rank in ranks for p in descendants(rank.process.pid)]
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
        kill_all(below)


def send_quietly(pipe: connection.Connection, message) -> None:
    """Send ``message`` unless the other end is already gone."""
    try:
        pipe.send(message)
    except OSError:
        pass


def stack_of(rank: Rank, wait_s: float = 0.5) -> str:
    """Ask a running rank for its Python stacks (SIGUSR1); return what it wrote.

    Returns only the new dump (earlier dumps are skipped), or "" if none came.
    """
    try:
        before = os.path.getsize(rank.stacks)
        os.kill(rank.process.pid, STACK_SIGNAL)
    except (OSError, TypeError):
        return ""
    deadline, size = time.monotonic() + wait_s, before
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = os.path.getsize(rank.stacks)
        if now > before and now == size:   # written, and no longer growing
            break
        size = now
    with open(rank.stacks) as f:
        f.seek(before)
        return f.read()
