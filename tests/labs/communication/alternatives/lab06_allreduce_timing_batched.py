"""Lab 06, exercise 6.1, another correct idiom: nccl-tests' batched mean.

nccl-tests (all_reduce_perf) times a block of back-to-back calls and divides by their
number; this one does the same, with the collectives imported by name and the clock
in nanoseconds, and a device synchronize before each clock read (a no-op on CPU).
"""
from time import perf_counter_ns

import torch
from torch.distributed import all_reduce, barrier


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_allreduce(ctx, sizes, iters=10, warmup=3):
    results = {}
    for size in sizes:
        buf = torch.zeros(size // 4, dtype=torch.float32, device=ctx.device)
        for _ in range(warmup):
            all_reduce(buf)
        _sync(ctx.device)
        barrier()
        begin = perf_counter_ns()
        for _ in range(iters):
            all_reduce(buf)
        _sync(ctx.device)
        results[size] = (perf_counter_ns() - begin) / 1e9 / iters
    return results
