"""Measure what a CPU cannot report by itself: peak activation bytes, collective bytes.

Taught in: lab 07 (activation checkpointing; FSDP2's all-gathers and reduce-scatters
against DDP's all-reduce). On GPUs ``step_memory`` reads
``torch.cuda.max_memory_allocated`` instead: same question, the allocator's answer.
"""

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["step_memory", "step_seconds", "allocator_peak", "count_collectives",
           "ring_bytes", "route_ddp_through_python"]


class _LiveTensors(TorchDispatchMode):
    """Sum the bytes of the storages created inside that are still alive, and the peak.

    Every op's outputs pass through ``__torch_dispatch__``; a weak reference to each
    new storage tells when autograd (or Python) has let it go.
    """

    def __init__(self, ignore: set):
        super().__init__()
        self.ignore = ignore          # storages alive before: weights, gradients, data
        self.live = {}                # storage id -> (weak reference, bytes)
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # forget the dead first: a new storage may reuse a dead one's address
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                key = storage._cdata
                if key not in self.ignore and key not in self.live:
                    self.live[key] = (StorageWeakRef(storage), storage.nbytes())
        self.now = sum(nbytes for _, nbytes in self.live.values())
        self.peak = max(self.peak, self.now)
        return out


def _loss(model, images, labels, forward):
    logits = forward(model, images) if forward else model(images)
    return F.cross_entropy(logits, labels)


def step_memory(model, images, labels, forward=None) -> dict:
    """Return the bytes one forward + backward holds beyond weights and gradients.

    ``after_forward``: alive when backward starts (saved activations); ``peak``: the
    most alive at once (recomputed blocks and gradient temporaries included).
    ``forward(model, images)`` replaces ``model(images)`` (e.g. with checkpointing).
    """
    _loss(model, images, labels, forward).backward()     # gradients now exist
    if images.device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = _loss(model, images, labels, forward)
        after = torch.cuda.memory_allocated() - base
        loss.backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        return {"after_forward": after, "peak": peak}
    alive = [images, labels] + [t for p in model.parameters() for t in (p, p.grad)
                                if t is not None]
    tracker = _LiveTensors({t.untyped_storage()._cdata for t in alive})
    with tracker:
        loss = _loss(model, images, labels, forward)
        after = tracker.now
        loss.backward()
    return {"after_forward": after, "peak": tracker.peak}


def step_seconds(model, images, labels, forward=None, repeats: int = 5) -> float:
    """Return the fastest of ``repeats`` forward + backward passes, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        _loss(model, images, labels, forward).backward()
        if images.device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


class Peak:
    """What ``allocator_peak`` measured: ``bytes`` (None on CPU, or before the end)."""

    bytes: int | None = None


def _warm_cuda_workspaces(device) -> None:
    """Run a Linear forward and backward once: the first matmul on a stream makes
    cuBLAS allocate a workspace that the process keeps (the backward runs on
    autograd's thread, with a cuBLAS handle and workspace of its own)."""
    layer = torch.nn.Linear(16, 16).to(device)
    layer(torch.ones(8, 16, device=device)).sum().backward()


@contextmanager
def allocator_peak(device):
    """Yield a ``Peak``; after the block, its ``bytes``: the most the CUDA allocator
    held inside the block, above what it held at the start.

    ``max_memory_allocated`` counts everything the process holds, also what came
    before: the previous run's leftovers, and cuBLAS's workspaces, allocated by the
    first matmuls and kept, which dominate a small model's peak. Those are
    allocated first here, then subtracted with the rest of the start's bytes, so
    every run measured in a row is measured alike. On CPU ``bytes`` stays None
    (``step_memory`` measures CPU tensors).
    """
    peak = Peak()
    if torch.device(device).type != "cuda":
        yield peak
        return
    _warm_cuda_workspaces(device)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    yield peak
    torch.cuda.synchronize(device)
    peak.bytes = torch.cuda.max_memory_allocated(device) - start


# torch.distributed name -> (kind, payload argument, its position). torch 2.13 renamed
# all_gather_into_tensor / reduce_scatter_tensor to *_single (the old names still work,
# with a FutureWarning; torch 2.6 has only them): both spellings are counted, once.
_COLLECTIVES = {
    "all_gather_single": ("all-gather", "output_tensor", 0),   # the gathered whole
    "all_gather_into_tensor": ("all-gather", "output_tensor", 0),
    "reduce_scatter_single": ("reduce-scatter", "input", 1),   # the whole, reduced
    "reduce_scatter_tensor": ("reduce-scatter", "input", 1),
    "all_reduce": ("all-reduce", "tensor", 0),
    "broadcast": ("broadcast", "tensor", 0),                # ZeroRedundancyOptimizer
}


def _spy(original, kind: str, keyword: str, position: int, log: list):
    """Wrap a collective so that each call appends (kind, payload bytes) to ``log``."""
    def spy(*args, **kwargs):
        tensor = kwargs[keyword] if keyword in kwargs else args[position]
        log.append((kind, tensor.numel() * tensor.element_size()))
        return original(*args, **kwargs)
    return spy


@contextmanager
def count_collectives(log: list):
    """Append (kind, payload bytes) to ``log`` for each collective called from Python.

    FSDP2 calls its all-gathers and reduce-scatters through ``torch.distributed``;
    DDP's all-reduce runs inside C++ unless ``route_ddp_through_python``.
    """
    saved = {name: getattr(dist, name) for name in _COLLECTIVES if hasattr(dist, name)}
    for name, original in saved.items():
        setattr(dist, name, _spy(original, *_COLLECTIVES[name], log))
    try:
        yield log
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def ring_bytes(log: list, world_size: int) -> float:
    """Return the bytes each rank sends for ``log``'s collectives, on average.

    With ring (or pipelined) algorithms all-gather, reduce-scatter and broadcast send
    (N-1)/N of the payload per rank; all-reduce, which is two of them, 2(N-1)/N.
    """
    share = (world_size - 1) / world_size
    return sum(nbytes * share * (2 if kind == "all-reduce" else 1)
               for kind, nbytes in log)


def route_ddp_through_python(model) -> None:
    """Make a DDP model all-reduce through ``torch.distributed`` (count_collectives).

    DDP's built-in all-reduce runs in C++; its default comm hook does the same
    arithmetic (divide by N, all-reduce each bucket) from Python.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model.register_comm_hook(None, default_hooks.allreduce_hook)
