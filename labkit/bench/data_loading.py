"""``labkit bench data``: batches/s of the device-resident fast path vs the DataLoader.

Taught in: lab 01 (data loading as a bottleneck). Last line:
``fast path vs DataLoader: <ratio>x``.
"""

import time

import torch

from labkit import data

__all__ = ["data_loading"]


def _batches_per_second(batches, count: int, warmup: int = 10) -> float:
    """Time ``count`` batches after ``warmup`` (worker start-up is not throughput)."""
    iterator = iter(batches)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(count):
        images, _labels = next(iterator)
    images.sum().item()  # make sure the last batch really exists
    return count / (time.perf_counter() - start)


def _both_paths(count: int) -> tuple[float, float]:
    """Return batches/s of the DataLoader and of the fast path, printing each."""
    print(f"Timing {count} batches of 64 MNIST images each way, on the CPU.")
    loader = data.dataloader(train=True, batch_size=64, num_workers=1)
    slow = _batches_per_second(loader, count)
    print(f"DataLoader (ToTensor+Normalize, 1 worker): {slow:,.0f} batches/s")
    fast_data = data.DeviceData.mnist(train=True)
    fast = _batches_per_second(fast_data.batches(64), count)
    print(f"fast path (tensors in memory, shuffled index): {fast:,.0f} batches/s")
    return slow, fast


def data_loading(count: int = 300) -> float:
    """Compare batches/s: fast path vs DataLoader (batch 64, 1 worker), in one run.

    Runs with one thread, so the DataLoader's worker has the other core; the
    caller's thread count is restored afterwards.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        slow, fast = _both_paths(count)
    finally:
        torch.set_num_threads(threads)
    ratio = fast / slow
    print(f"fast path vs DataLoader: {ratio:.1f}x")
    return ratio
