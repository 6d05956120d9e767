"""Benchmarks of the launcher and of DDP scaling: ``labkit bench launch`` and ``ddp``.

Taught in: lab 03 (what a launch costs; images/s for 1 and 2 ranks). Each prints what
it measures, then its headline ratio as the last line. Both run on CPU with gloo.
"""

import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from labkit import launch, train

__all__ = ["time_to_ready", "launch_cost", "images_per_second", "ddp_scaling"]


def time_to_ready(ctx) -> float:
    """Return the wall-clock time at which this rank's process group was up."""
    return time.time()


def _import_torch_seconds() -> float:
    """Time a fresh ``python -c "import torch"``, the floor any launch pays once."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - start


def _launch_seconds(world_size: int) -> float:
    """Time from calling ``launch.run`` to the last rank having its group up."""
    start = time.time()
    ready = launch.run(time_to_ready, world_size=world_size, backend="gloo")
    return max(ready) - start


def launch_cost(world_size: int = 2, repeats: int = 3) -> float:
    """Compare launch-to-ready of a gloo launch with a bare ``import torch``, same run.

    The first launch in a Python starts the forkserver (which imports torch and
    DDP's dependencies once); later launches fork ranks from it. The headline uses
    the first, slower one.
    """
    method = os.environ.get("LABKIT_START_METHOD", "forkserver")
    print(f"Start method: {method}. Timing `python -c 'import torch'` (best of 2)...")
    bare = min(_import_torch_seconds() for _ in range(2))
    print(f"import torch in a fresh Python: {bare:.2f} s")
    first = _launch_seconds(world_size)
    again = statistics.median(_launch_seconds(world_size) for _ in range(repeats))
    print(f"{world_size}-rank gloo launch, the first in this Python: {first:.2f} s "
          "until every rank is ready")
    print(f"{world_size}-rank gloo launch, the next ones (median of {repeats}): "
          f"{again:.2f} s ({again / bare:.2f}x import torch)")
    ratio = first / bare
    print(f"launch vs import torch: {ratio:.2f}x")
    return ratio


def images_per_second(ctx, global_batch: int, steps: int, warmup: int,
                      sync: bool = True) -> tuple:
    """Train small_cnn on this rank's share of each global batch.

    Returns (images/s of the whole global batch, CPU share: CPU seconds this rank
    used per wall-clock second, 1.0 = a whole core). One rank trains the plain
    model, several wrap it in DDP; ``sync=False`` trains unwrapped copies side by
    side (no communication: the most this machine allows). Timing starts after
    ``warmup`` steps (DDP builds its buckets in the first ones) and a barrier.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit import data, models

    per_rank = global_batch // ctx.world_size
    split = data.DeviceData.mnist(train=True, limit=per_rank * (steps + warmup))
    batches = list(split.batches(per_rank, generator=torch.Generator().manual_seed(0)))
    torch.manual_seed(0)
    model = models.small_cnn()
    if ctx.world_size > 1 and sync:
        model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for images, labels in batches[:warmup]:
        train.train_step(model, images, labels, optimizer)  # DDP all-reduces inside
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for images, labels in batches[warmup:]:
        train.train_step(model, images, labels, optimizer)  # DDP all-reduces inside
    dist.barrier()   # the step is done when the slowest rank is done
    wall = time.perf_counter() - start
    return global_batch * steps / wall, (time.process_time() - cpu_start) / wall


def _measure(world_size: int, args: tuple) -> tuple:
    """Launch ``images_per_second``; return the slowest rank's rate, all CPU shares."""
    ranks = launch.run(images_per_second, world_size=world_size, args=args,
                       backend="gloo", timeout=300)
    return min(rate for rate, _ in ranks), [share for _, share in ranks]


def ddp_scaling(global_batch: int = 512, steps: int = 30, warmup: int = 5,
                repeats: int = 3) -> float:
    """Compare images/s of 2 DDP ranks with 1 rank, 1 thread each, same global batch.

    The two are measured alternately, ``repeats`` times each; the best of each counts
    (other programs on the machine only ever slow a run down). Two copies trained
    side by side without communication show the ceiling the cores allow. A global
    batch of 512 keeps 256 images per rank: on x86 CPUs a batch of 128 often takes
    a slower convolution kernel, which would blur the comparison.
    """
    print(f"small_cnn on MNIST tensors, global batch {global_batch}, {steps} timed "
          f"steps, gloo, 1 thread per rank; best of {repeats}, alternating.")
    args, one, two = (global_batch, steps, warmup), (0.0, []), (0.0, [])
    ceiling = (0.0, [])
    for _ in range(repeats):
        one = max(one, _measure(1, args))
        two = max(two, _measure(2, args))
        ceiling = max(ceiling, _measure(2, (*args, False)))
    shares = ", ".join(f"{share:.2f}" for share in one[1] + two[1])
    print(f"1 rank x 1 thread: {one[0]:,.0f} images/s")
    print(f"2 ranks x 1 thread (DDP): {two[0]:,.0f} images/s, scaling efficiency "
          f"{two[0] / (2 * one[0]):.0%}")
    print(f"2 copies side by side, no communication: {ceiling[0]:,.0f} images/s "
          f"({ceiling[0] / one[0]:.2f}x one rank: the most these cores give); DDP "
          f"reaches {two[0] / ceiling[0]:.0%} of it")
    print(f"CPU share each rank got (1.00 = a whole core): {shares}")
    if min(two[1]) < 0.85:
        print("Note: a DDP rank below 1.00 spent that share waiting: for the slower "
              "rank at each all-reduce (the step ends when the slowest rank is done), "
              "for the all-reduce itself, or for other programs on this machine.")
    ratio = two[0] / one[0]
    print(f"ddp 2 ranks vs 1 rank: {ratio:.2f}x")
    return ratio
