"""Data parallelism by hand in one process: replicate, scatter, run, gather, average.

Taught in: lab 02 (what ``nn.DataParallel`` does on every step, built by hand first).
Replicas live on the devices given: one GPU each when there are enough, else copies on
the CPU. The arithmetic is the same either way; only the speed differs.
"""

import copy
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "replica_devices",
    "replicate",
    "scatter",
    "run_replicas",
    "gather",
    "average_gradients",
    "data_parallel_step",
    "dataparallel_memory",
]


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


def replicate(model: nn.Module, devices: list[torch.device]) -> list[nn.Module]:
    """Return one copy of ``model`` per device (DataParallel redoes this every step)."""
    return [copy.deepcopy(model).to(device) for device in devices]


def scatter(
    images: torch.Tensor, labels: torch.Tensor, devices: list[torch.device]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split a batch along dim 0 into one chunk per device (sizes differ by <= 1)."""
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels.")
    if len(images) < len(devices):
        raise ValueError(
            f"A batch of {len(images)} cannot feed {len(devices)} replicas: "
            "use a batch at least as large as the number of replicas."
        )
    pieces = zip(images.tensor_split(len(devices)), labels.tensor_split(len(devices)))
    return [(x.to(device), y.to(device)) for (x, y), device in zip(pieces, devices)]


def _forward_backward(replica, chunk, total: int):
    """Run one replica on its chunk; scale its mean loss by its share of the batch."""
    images, labels = chunk
    logits = replica(images)
    loss = F.cross_entropy(logits, labels) * (len(labels) / total)
    loss.backward()
    return logits.detach(), loss.detach()


def run_replicas(replicas, chunks, threads: bool = True):
    """Run forward and backward on every replica; return (logits, weighted losses).

    With ``threads`` each replica runs in its own Python thread, as DataParallel's
    ``parallel_apply`` does: the GIL serialises the Python parts of every step.
    """
    total = sum(len(labels) for _, labels in chunks)
    if not threads:
        results = [_forward_backward(r, c, total) for r, c in zip(replicas, chunks)]
    else:
        with ThreadPoolExecutor(len(replicas)) as pool:
            results = list(
                pool.map(_forward_backward, replicas, chunks, [total] * len(chunks))
            )
    return [r[0] for r in results], [r[1] for r in results]


def gather(tensors: list[torch.Tensor], device) -> torch.Tensor:
    """Concatenate per-replica outputs on ``device`` (DataParallel's output device)."""
    return torch.cat([t.to(device) for t in tensors])


def average_gradients(replicas, model: nn.Module) -> None:
    """Add up the replicas' gradients into ``model``'s ``.grad`` on its device.

    Each replica's loss was already scaled by its share of the batch, so the sum is
    the gradient of the mean loss over the whole batch.
    """
    for param, *copies in zip(model.parameters(), *(r.parameters() for r in replicas)):
        param.grad = torch.stack([c.grad.to(param.device) for c in copies]).sum(dim=0)


def data_parallel_step(
    model, images, labels, optimizer, devices, threads: bool = True
) -> float:
    """Take one data-parallel SGD step by hand; return the loss over the whole batch."""
    replicas = replicate(model, devices)  # 1. broadcast the weights
    chunks = scatter(images, labels, devices)  # 2. split the batch
    _, losses = run_replicas(replicas, chunks, threads)  # 3. forward + backward
    optimizer.zero_grad(set_to_none=True)
    average_gradients(replicas, model)  # 4. reduce gradients to device 0
    optimizer.step()  # 5. update the one true model
    return sum(loss.item() for loss in losses)


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
