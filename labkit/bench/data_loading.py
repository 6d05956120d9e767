"""Benchmarks behind the course's measured claims, run as ``labkit bench NAME``.

Taught in: lab 01 (``data``: the fast path vs the DataLoader). Each benchmark prints
what it measures first, and its headline ratio as the last line.
"""

import time

import torch

from labkit import data

__all__ = ["BENCHMARKS", "run", "data_loading"]


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


def pipeline_bubble() -> float:
    """Measure GPipe's bubble against (p-1)/(m+p-1) (lab 05); see ``pipeline_run``."""
    from labkit import pipeline_run

    return pipeline_run.bubble_benchmark()


def launch_cost() -> float:
    """Launch-to-ready of a 2-rank gloo launch over a bare ``import torch``."""
    from labkit import ddp_bench

    return ddp_bench.launch_cost()


def ddp_scaling() -> float:
    """Images/s of 2 DDP ranks over 1 rank, 1 thread each, same global batch."""
    from labkit import ddp_bench

    return ddp_bench.ddp_scaling()


BENCHMARKS = {
    "launch": launch_cost,
    "ddp": ddp_scaling,
    "pipeline": pipeline_bubble,
    "data": data_loading,
}


def run(name: str):
    """Run the benchmark called ``name``; an unknown name lists the valid ones."""
    if name not in BENCHMARKS:
        raise ValueError(
            f"Unknown benchmark {name!r}: choose one of "
            f"{', '.join(sorted(BENCHMARKS))}."
        )
    return BENCHMARKS[name]()
