"""``labkit bench data``: batches/s of the device-resident fast path vs the DataLoader.

Taught in: lab 01 (data loading as a bottleneck). The two paths take turns (DataLoader,
fast path, DataLoader, ...) so that both meet the same load from other programs; one
ratio per pair. Last line: ``fast path vs DataLoader: <median>x (<min>–<max>x over
<n> pairs)``.
"""

import torch

from labkit import data
from labkit.bench import Ratios, alternate
from labkit.labs.single_device.loading import batches_per_second, endless

__all__ = ["data_loading"]


def _measure(seconds: float, pairs: int) -> tuple[list, list]:
    """Return batches/s of the DataLoader and of the fast path, one per turn each."""
    loader = data.dataloader(train=True, batch_size=64, num_workers=1)
    fast_data = data.DeviceData.mnist(train=True)
    slow = endless(lambda: loader)         # persistent worker: started once
    fast = endless(lambda: fast_data.batches(64))
    for _ in range(10):                    # worker start-up is not throughput
        next(slow), next(fast)
    return alternate(lambda: batches_per_second(slow, seconds),
                     lambda: batches_per_second(fast, seconds), pairs)


def data_loading(seconds: float = 1.5, pairs: int = 7) -> float:
    """Compare batches/s: fast path vs DataLoader (batch 64, 1 worker); return the median.

    Each turn takes batches from one path for ``seconds`` (a fixed time, not a fixed
    count: the fast path is about a hundred times quicker), DataLoader first. Runs
    with one thread, so the DataLoader's worker has the other core; the caller's
    thread count is restored afterwards.
    """
    print(f"Batches of 64 MNIST images on the CPU, the two paths in turn: {pairs} "
          f"pairs of {seconds:g} s each, DataLoader then fast path.")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        slow, fast = _measure(seconds, pairs)
    finally:
        torch.set_num_threads(threads)
    print("DataLoader (ToTensor+Normalize, 1 worker), batches/s: "
          + ", ".join(f"{rate:,.0f}" for rate in slow))
    print("fast path (tensors in memory, shuffled index), batches/s: "
          + ", ".join(f"{rate:,.0f}" for rate in fast))
    ratios = Ratios(tuple(f / s for f, s in zip(fast, slow)), null=1.0, digits=0)
    note = ratios.noise_note("the fast path's gain")
    if note:
        print(note)
    print(ratios.headline("fast path vs DataLoader"))
    return ratios.median
