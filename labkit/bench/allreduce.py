"""``labkit bench allreduce``: all-reduce time, algbw and busbw from 4 B to 64 MiB, the
way nccl-tests reports them, and the alpha-beta fit.

Taught in: lab 06 (the learner writes ``time_allreduce``; this is labkit's copy, and
a test checks the two agree). NCCL with one GPU per rank when there are 2 GPUs or
more, else 2 gloo CPU ranks. Last line: ``allreduce busbw at 64 MB: <GB/s>`` (64 MB
as nccl-tests counts it: 64 MiB = 67,108,864 bytes).
"""

import statistics
import time

import torch
import torch.distributed as dist

from labkit import comm_model, hardware, launch

__all__ = ["time_allreduce", "sizes_up_to", "allreduce"]

HEADLINE_BYTES = 64 * 2**20


def _synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_allreduce(ctx, sizes, iters: int = 10, warmup: int = 3) -> dict:
    """Return ``{n_bytes: median seconds}`` of all-reducing a float32 tensor per size.

    For each size: ``warmup`` untimed calls (connections, buffers, NCCL's first-call
    set-up), a barrier so every rank starts the clock together, then ``iters`` timed
    calls, each waited for (on GPUs: synchronize) before the clock stops.
    """
    times = {}
    for n_bytes in sizes:
        tensor = torch.ones(max(1, n_bytes // 4), device=ctx.device)   # 4 B per float
        for _ in range(warmup):
            dist.all_reduce(tensor)
        _synchronize(ctx.device)
        dist.barrier()
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            dist.all_reduce(tensor)
            _synchronize(ctx.device)
            samples.append(time.perf_counter() - start)
        times[n_bytes] = statistics.median(samples)
    return times


def sizes_up_to(max_bytes: int, min_bytes: int = 4, factor: int = 4) -> list[int]:
    """Return ``min_bytes``, x factor, ... up to ``max_bytes`` (4 B to 64 MiB: 13)."""
    sizes, n_bytes = [], min_bytes
    while n_bytes <= max_bytes:
        sizes.append(n_bytes)
        n_bytes *= factor
    return sizes


def _measure(world_size: int, backend: str, sizes: list[int]) -> dict:
    """Time small sizes with many iterations and large ones with few (two launches)."""
    small = [n for n in sizes if n < 2**22]
    large = [n for n in sizes if n >= 2**22]
    times = {}
    for group, iters in ((small, 20), (large, 5)):
        if group:
            ranks = launch.run(time_allreduce, world_size, args=(group, iters, 3),
                               backend=backend, timeout=300)
            # The slowest rank decides when a collective is done everywhere.
            times.update({n: max(r[n] for r in ranks) for n in group})
    return times


def allreduce(max_bytes: int = HEADLINE_BYTES) -> float:
    """Measure all-reduce from 4 B to ``max_bytes``; print the table; return busbw.

    The returned figure is busbw (GB/s) at the largest size.
    """
    gpus = torch.cuda.device_count()
    world_size = gpus if gpus >= 2 else 2
    backend = "nccl" if gpus >= 2 else "gloo"
    setup = hardware.choose(world_size, backend, verbose=False)
    print(f"all-reduce of float32 tensors, 4 B to {max_bytes:,} B, {world_size} ranks, "
          f"{setup.backend} on {setup.device_type} ({setup.reason}); median of 20 "
          "iterations (5 from 4 MiB), after 3 warm-up calls and a barrier.")
    times = _measure(world_size, backend, sizes_up_to(max_bytes))
    fit = comm_model.fit_alpha_beta(times)
    rows = comm_model.table(times, world_size, fit)
    print(f"alpha-beta fit: {fit}")
    if setup.device_type == "cpu":
        memcpy = comm_model.memcpy_gbytes_per_s()
        print(f"loopback memcpy (one thread, 64 MiB): {memcpy:.2f} GB/s; busbw reached "
              f"{rows[-1]['busbw'] / memcpy:.0%} of it (gloo goes through TCP).")
    else:
        print("For comparison (lab 00): NVLink 4 450 GB/s each way, PCIe 5 x16 ~63 "
              "GB/s, InfiniBand NDR 50 GB/s per port.")
    busbw = rows[-1]["busbw"]
    label = "64 MB" if max_bytes == HEADLINE_BYTES else f"{max_bytes:,} B"
    print(f"allreduce busbw at {label}: {busbw:.2f} GB/s")
    return busbw
