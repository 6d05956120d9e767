"""Plumbing for data parallelism in one process: where the replicas go, exact float32
for equality proofs, and the per-GPU memory of an ``nn.DataParallel`` step.

Taught in: lab 02. The data-parallel step itself (replicate, scatter, the replicas in
threads, the weighted gradient average, the step) is the learner's: it lives in the
lab's ``%%writefile`` cells, and ``labkit.checks.data_parallel`` checks it.
"""

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["replica_devices", "exact_float32", "dataparallel_memory"]


def replica_devices(num_replicas: int, verbose: bool = True) -> list[torch.device]:
    """Return one device per replica: distinct GPUs if enough, else the CPU."""
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(
            f"num_replicas must be a positive integer, got {num_replicas!r}."
        )
    found = torch.cuda.device_count()
    if found >= num_replicas:
        devices = [torch.device("cuda", i) for i in range(num_replicas)]
        why = f"{found} GPU(s) found: one replica per GPU"
    else:
        devices = [torch.device("cpu")] * num_replicas
        why = (
            f"{found} GPU(s) found, {num_replicas} replicas wanted: all replicas are "
            "copies on the CPU (same arithmetic, no speed-up)"
        )
    if verbose:
        print(f"Replicas on {[str(d) for d in devices]} - {why}")
    return devices


@contextmanager
def exact_float32():
    """Run the block with TF32 off (cuDNN convolutions and matmuls), then restore.

    On NVIDIA GPUs since Ampere, cuDNN runs float32 convolutions in TF32 (a 10-bit
    mantissa) by default, so two ways of computing one gradient differ by ~1e-3
    instead of ~1e-7: too much for an equality proof. On a CPU nothing changes.
    """
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def dataparallel_memory(model: nn.Module, batch: int = 512) -> list[int] | None:
    """Return each GPU's peak bytes in a DataParallel step; None without 2 GPUs."""
    count = torch.cuda.device_count()
    if count < 2:
        print(
            f"{count} GPU(s): nn.DataParallel has nothing to spread; no per-GPU "
            "memory to measure here."
        )
        return None
    wrapped = nn.DataParallel(model.to("cuda:0"))
    optimizer = torch.optim.Adam(wrapped.parameters())
    for i in range(count):
        torch.cuda.reset_peak_memory_stats(i)
    images = torch.randn(batch, 1, 28, 28, device="cuda:0")
    labels = torch.randint(0, 10, (batch,), device="cuda:0")
    loss = F.cross_entropy(wrapped(images), labels)
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    return [torch.cuda.max_memory_allocated(i) for i in range(count)]
