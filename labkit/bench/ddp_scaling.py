"""``labkit bench ddp``: how close 2 DDP ranks come to what the cores allow.

Taught in: lab 03 (images/s for 1 and 2 ranks) and lab 06 (what communication costs).
Compares images/s of 2 DDP ranks with two copies that train side by side and never
talk (the no-communication ceiling: the most these cores give), both gloo, one thread
per rank. Last line: ``ddp vs no-communication ceiling: <percent>%``.
"""

import os
import time

import torch
import torch.distributed as dist

from labkit import data, hardware, launch, models, train

__all__ = ["images_per_second", "measure", "ddp_scaling"]

# The models a measurement can train: the small CNN (cheap, CPU ranks), or an MLP
# wide enough that a GPU step is long next to its all-reduce (NCCL ranks).
MODELS = {"small_cnn": lambda: models.small_cnn(),
          "wide_mlp": lambda: models.deep_mlp(num_layers=6, width=4096)}


def _pin_to_a_core(rank: int) -> None:
    """Keep this rank on one core of its own, so that two ranks never trade places.

    Without it the scheduler may move both ranks' threads around the same cores;
    every migration costs cache and the step waits for the slower rank.
    """
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})


def images_per_second(ctx, global_batch: int, steps: int, warmup: int,
                      sync: bool = True, pin: bool = True, bucket_view: bool = True,
                      model_name: str = "small_cnn") -> tuple:
    """Train small_cnn on this rank's share of each global batch.

    Returns (images/s of the whole global batch, CPU share: CPU seconds this rank
    used per wall-clock second, 1.0 = a whole core). One rank trains the plain
    model, several wrap it in DDP; ``sync=False`` trains unwrapped copies side by
    side (no communication: the most this machine allows). Timing starts after
    ``warmup`` steps (DDP builds its buckets in the first ones) and a barrier.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    if pin and ctx.device.type == "cpu":
        _pin_to_a_core(ctx.rank)
    per_rank = global_batch // ctx.world_size
    split = data.DeviceData.mnist(train=True, limit=per_rank * (steps + warmup),
                                  device=ctx.device)
    batches = list(split.batches(per_rank, generator=torch.Generator().manual_seed(0)))
    torch.manual_seed(0)
    model = MODELS[model_name]().to(ctx.device)
    if ctx.world_size > 1 and sync:
        device_ids = [ctx.device] if ctx.device.type == "cuda" else None
        model = DDP(model, device_ids=device_ids, gradient_as_bucket_view=bucket_view)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for images, labels in batches[:warmup]:
        train.train_step(model, images, labels, optimizer)  # DDP all-reduces inside
    train.synchronize(ctx.device)
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for images, labels in batches[warmup:]:
        train.train_step(model, images, labels, optimizer)  # DDP all-reduces inside
    train.synchronize(ctx.device)
    dist.barrier()   # the step is done when the slowest rank is done
    wall = time.perf_counter() - start
    return global_batch * steps / wall, (time.process_time() - cpu_start) / wall


def _measure(world_size: int, args: tuple, backend: str = "gloo") -> tuple:
    """Launch ``images_per_second``; return the slowest rank's rate, all CPU shares."""
    ranks = launch.run(images_per_second, world_size=world_size, args=args,
                       backend=backend, timeout=300)
    return min(rate for rate, _ in ranks), [share for _, share in ranks]


def measure(world_size: int, args: tuple, model_name: str = "small_cnn",
            sync: bool = True) -> float:
    """Images/s of ``world_size`` ranks (the slowest rank's), on the backend chosen here.

    ``args`` = (global batch, timed steps, warm-up steps). ``sync=False`` trains
    copies side by side without DDP: the no-communication ceiling. Lab 03 calls it.
    """
    return _measure(world_size, (*args, sync, True, True, model_name), "auto")[0]


def ddp_scaling(global_batch: int = 512, steps: int = 30, warmup: int = 5,
                repeats: int = 3, pin: bool = True, bucket_view: bool = True) -> float:
    """Compare 2 DDP ranks with the no-communication ceiling; return DDP's share of it.

    1 rank, 2 DDP ranks and 2 silent copies are measured in turn, ``repeats`` times
    each; the best of each counts (other programs on the machine only ever slow a
    run down). A global batch of 512 keeps 256 images per rank: on x86 CPUs a batch
    of 128 often takes a slower convolution kernel, which would blur the comparison.
    ``pin`` keeps each rank on a core of its own.
    """
    print(f"small_cnn on MNIST tensors, global batch {global_batch}, {steps} timed "
          f"steps, gloo, 1 thread per rank{', each rank pinned to a core' if pin else ''}"
          f"; {hardware.cpu_count()} usable core(s); best of {repeats}, in turn.")
    one, two, ceiling = (0.0, []), (0.0, []), (0.0, [])
    for _ in range(repeats):
        one = max(one, _measure(1, (global_batch, steps, warmup, True, pin, bucket_view)))
        two = max(two, _measure(2, (global_batch, steps, warmup, True, pin, bucket_view)))
        ceiling = max(ceiling, _measure(2, (global_batch, steps, warmup, False, pin, bucket_view)))
    shares = ", ".join(f"{share:.2f}" for share in two[1] + ceiling[1])
    print(f"1 rank x 1 thread: {one[0]:,.0f} images/s")
    print(f"2 ranks x 1 thread (DDP): {two[0]:,.0f} images/s ({two[0] / one[0]:.2f}x "
          f"one rank, scaling efficiency {two[0] / (2 * one[0]):.0%})")
    print(f"2 copies side by side, no communication: {ceiling[0]:,.0f} images/s "
          f"({ceiling[0] / one[0]:.2f}x one rank: the most these cores give)")
    print(f"CPU share each rank got (1.00 = a whole core), DDP then copies: {shares}")
    if min(two[1]) < 0.85:
        print("Note: a DDP rank below 1.00 spent that share waiting: for the slower "
              "rank at each all-reduce (the step ends when the slowest rank is done), "
              "for the all-reduce itself, or for other programs on this machine.")
    percent = 100 * two[0] / ceiling[0]
    print(f"ddp vs no-communication ceiling: {percent:.0f}%")
    return percent
