"""``labkit bench ddp``: how close 2 DDP ranks come to what the cores allow.

Taught in: lab 03 (images/s for 1 and 2 ranks) and lab 06 (what communication costs).
Compares images/s of 2 DDP ranks with two copies that train side by side and never
talk (the no-communication ceiling: the most these cores give), both gloo, one thread
per rank. The two take turns inside the same two processes, so that both see the
same machine. Last line: ``ddp vs no-communication ceiling: <median>% (<min>–<max>%
over <n> pairs)``.
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

from labkit import data, hardware, launch, models, train
from labkit.bench import Ratios, alternate

__all__ = ["images_per_second", "measure", "alternating_rates", "ddp_vs_copies",
           "ddp_scaling"]

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
            sync: bool = True, backend: str = "auto") -> float:
    """Images/s of ``world_size`` ranks (the slowest rank's), on ``backend``.

    ``args`` = (global batch, timed steps, warm-up steps). ``sync=False`` trains
    copies side by side without DDP: the no-communication ceiling. Lab 03 calls it
    with its one backend (``backend=setup.backend``), so that 1 rank and 2 ranks run
    on the same kind of device.
    """
    return _measure(world_size, (*args, sync, True, True, model_name), backend)[0]


def _block(model, optimizer, batches, global_batch: int, device) -> tuple:
    """Train on ``batches``; return (images/s of the global batch, CPU share)."""
    train.synchronize(device)
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for images, labels in batches:
        train.train_step(model, images, labels, optimizer)  # DDP all-reduces inside
    train.synchronize(device)
    dist.barrier()   # the step is done when the slowest rank is done
    wall = time.perf_counter() - start
    return global_batch * len(batches) / wall, (time.process_time() - cpu_start) / wall


def alternating_rates(ctx, global_batch: int, steps: int, warmup: int, pairs: int,
                      pin: bool = True, bucket_view: bool = True,
                      model_name: str = "small_cnn") -> dict:
    """Train a DDP model and a silent copy of it in turn, in the same processes.

    Both start from the same weights and see the same batches: ``steps`` steps of
    DDP (all-reduce in every backward), then ``steps`` of the copy (no communication:
    the ceiling), ``pairs`` times. Same processes, cores, data and memory: the only
    difference between the arms is the communication. With one rank there is no
    DDP: it times the copy alone. Returns {"ddp": [...], "copy": [...], "share": ...}
    (images/s of the global batch per block; CPU share of this rank in DDP blocks).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    if pin and ctx.device.type == "cpu":
        _pin_to_a_core(ctx.rank)
    per_rank = global_batch // ctx.world_size
    split = data.DeviceData.mnist(train=True, limit=per_rank * max(steps, warmup),
                                  device=ctx.device)
    batches = list(split.batches(per_rank, generator=torch.Generator().manual_seed(0)))
    models_ = {}
    for arm in ("copy", "ddp") if ctx.world_size > 1 else ("copy",):
        torch.manual_seed(0)
        model = MODELS[model_name]().to(ctx.device)
        if arm == "ddp":
            device_ids = [ctx.device] if ctx.device.type == "cuda" else None
            model = DDP(model, device_ids=device_ids, gradient_as_bucket_view=bucket_view)
        models_[arm] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
        for images, labels in batches[:warmup]:   # DDP builds its buckets here
            train.train_step(models_[arm][0], images, labels, models_[arm][1])
    timed = batches[:steps]
    arms = {arm: (lambda m=m, o=o: _block(m, o, timed, global_batch, ctx.device))
            for arm, (m, o) in models_.items()}
    if "ddp" not in arms:
        return {"copy": [arms["copy"]()[0] for _ in range(pairs)], "ddp": [],
                "share": []}
    ddp, copy = alternate(arms["ddp"], arms["copy"], pairs)
    return {"ddp": [rate for rate, _ in ddp], "copy": [rate for rate, _ in copy],
            "share": [share for _, share in ddp]}


def ddp_vs_copies(world_size: int = 2, global_batch: int = 512, steps: int = 6,
                  warmup: int = 3, pairs: int = 9, backend: str = "gloo",
                  pin: bool = True, bucket_view: bool = True,
                  model_name: str = "small_cnn") -> dict:
    """Launch ``alternating_rates``; per pair the slowest rank's rates and their ratio.

    Returns {"ddp": [...], "copy": [...], "ratios": Ratios in %, "share": [...]}.
    """
    ranks = launch.run(alternating_rates, world_size=world_size, backend=backend,
                       args=(global_batch, steps, warmup, pairs, pin, bucket_view,
                             model_name), timeout=300, report_every=300)
    ddp = [min(r["ddp"][i] for r in ranks) for i in range(len(ranks[0]["ddp"]))]
    copy = [min(r["copy"][i] for r in ranks) for i in range(len(ranks[0]["copy"]))]
    ratios = Ratios(tuple(100 * d / c for d, c in zip(ddp, copy)), null=100.0,
                    unit="%", digits=0) if ddp else None
    return {"ddp": ddp, "copy": copy, "ratios": ratios,
            "share": [s for r in ranks for s in r["share"]]}


def ddp_scaling(global_batch: int = 512, steps: int = 6, warmup: int = 3,
                pairs: int = 9, pin: bool = True, bucket_view: bool = True) -> float:
    """Compare 2 DDP ranks with the no-communication ceiling; return DDP's median %.

    In one launch of 2 ranks, blocks of ``steps`` DDP steps and of ``steps`` steps of
    a silent copy alternate ``pairs`` times (``alternating_rates``): each pair gives
    one ratio, measured under the same conditions. One rank alone is timed once more,
    for the scaling line. A global batch of 512 keeps 256 images per rank: on x86
    CPUs a batch of 128 often takes a slower convolution kernel, which would blur the
    comparison. ``pin`` keeps each rank on a core of its own.
    """
    print(f"small_cnn on MNIST tensors, global batch {global_batch}, gloo, 1 thread "
          f"per rank{', each rank pinned to a core' if pin else ''}; "
          f"{hardware.cpu_count()} usable core(s). {pairs} pairs of {steps}-step "
          "blocks in the same 2 ranks: DDP, then a copy that never communicates.")
    both = ddp_vs_copies(2, global_batch, steps, warmup, pairs, "gloo", pin, bucket_view)
    one = ddp_vs_copies(1, global_batch, steps, warmup, 3, "gloo", pin, bucket_view)
    one_rank = statistics.median(one["copy"])
    ddp, copy, ratios = both["ddp"], both["copy"], both["ratios"]
    print("2 ranks x 1 thread, DDP, images/s: " + ", ".join(f"{r:,.0f}" for r in ddp))
    print("2 silent copies side by side, images/s: "
          + ", ".join(f"{r:,.0f}" for r in copy))
    print(f"1 rank x 1 thread: {one_rank:,.0f} images/s (median of 3 blocks); DDP "
          f"median {statistics.median(ddp) / one_rank:.2f}x one rank, scaling "
          f"efficiency {statistics.median(ddp) / (2 * one_rank):.0%}")
    shares = both["share"]
    print(f"CPU share of the DDP blocks (1.00 = a whole core): {min(shares):.2f}-"
          f"{max(shares):.2f}")
    if min(shares) < 0.85:
        print("Note: a DDP rank below 1.00 spent that share waiting: for the slower "
              "rank at each all-reduce (the step ends when the slowest rank is done), "
              "for the all-reduce itself, or for other programs on this machine.")
    if ratios.median > 100:
        print("Note: DDP came out above the ceiling, which communication cannot do: "
              "the pairs are dominated by other programs on this machine.")
    note = ratios.noise_note("the cost of communication")
    if note:
        print(note)
    print(ratios.headline("ddp vs no-communication ceiling"))
    return ratios.median
