"""Workers that lab 03 launches on N ranks: collectives, DDP training, DDP's internals.

Taught in: lab 03 (DistributedDataParallel); ``labkit bench ddp``. Each worker takes
the launcher's rank context (``rank``, ``world_size``, ``device``) first and returns
a picklable result that the parent prints: children's prints never reach a notebook
under nbval. ``reference`` is the one-process run that DDP must reproduce exactly.
"""

import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit import data, models
from labkit.train import synchronize

__all__ = [
    "TrainConfig",
    "collectives",
    "train",
    "reference",
    "internals",
]


@dataclass(frozen=True)
class TrainConfig:
    """What a DDP run (or its one-process reference) trains, on which data, how long."""

    steps: int = 30
    global_batch: int = 64  # across all ranks: each rank gets global_batch/world_size
    lr: float = 0.05
    seed: int = 0
    limit: int | None = 4096  # MNIST training images every rank loads (None: all)
    synthetic: int = 0  # > 0: that many random images instead of MNIST (tests)
    warmup: int = 2  # first steps left out of the timing (DDP sets up buckets)

    def check(self, world_size: int) -> None:
        """Raise ValueError unless the batch splits evenly and some steps are timed."""
        if self.global_batch % world_size:
            raise ValueError(
                f"global_batch={self.global_batch} does not split evenly over "
                f"{world_size} ranks: DDP averages per-rank gradients with equal "
                "weights, and uneven batches can leave a rank waiting forever. "
                f"Use a multiple of {world_size}."
            )
        if self.steps <= self.warmup:
            raise ValueError(
                f"steps={self.steps} must exceed warmup={self.warmup}: "
                "the warm-up steps are not timed."
            )


def collectives(ctx) -> dict:
    """Run all-reduce (sum), broadcast (from rank 0), all-gather; return the values."""
    reduced = torch.tensor([ctx.rank + 1.0], device=ctx.device)
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)  # every rank: 1 + 2 + ... + N
    sent = torch.tensor([100.0 + ctx.rank], device=ctx.device)
    dist.broadcast(sent, src=0)  # every rank: rank 0's 100
    gathered = [torch.zeros(1, device=ctx.device) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, torch.tensor([10.0 * ctx.rank], device=ctx.device))
    return {
        "rank": ctx.rank,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "all_reduce": (ctx.rank + 1.0, reduced.item()),
        "broadcast": (100.0 + ctx.rank, sent.item()),
        "all_gather": (10.0 * ctx.rank, [t.item() for t in gathered]),
    }


def _dataset(cfg: TrainConfig, device):
    """Return (images, labels) on ``device``: MNIST, or noise if ``synthetic``."""
    if cfg.synthetic:
        return data.random_batch(cfg.synthetic, cfg.seed + 1, device)
    split = data.DeviceData.mnist(train=True, device=device, limit=cfg.limit)
    return split.images, split.labels


def _global_batches(cfg: TrainConfig, num_samples: int):
    """Yield each step's global batch of indices, identical on every rank."""
    gen, order = (
        torch.Generator().manual_seed(cfg.seed),
        torch.empty(0, dtype=torch.long),
    )
    for _ in range(cfg.steps):
        if len(order) < cfg.global_batch:
            order = torch.cat([order, torch.randperm(num_samples, generator=gen)])
        yield order[: cfg.global_batch]
        order = order[cfg.global_batch :]


def _loop(model, cfg: TrainConfig, images, labels, rank: int, world_size: int):
    """Train on this rank's share of each global batch; return (losses, timed s)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    if labels.device.type == "cuda":  # true fp32 in DDP and reference alike: no TF32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    losses, start = [], 0.0
    for step, index in enumerate(_global_batches(cfg, len(labels))):
        if step == cfg.warmup:
            start = time.perf_counter()
        mine = index[rank::world_size].to(labels.device)  # like DistributedSampler
        loss = F.cross_entropy(model(images[mine]), labels[mine])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces here
        optimizer.step()
        losses.append(loss.item())  # .item() waits for the GPU
    return losses, time.perf_counter() - start


def _result(
    model, cfg: TrainConfig, losses, seconds, rank: int, keep_state: bool
) -> dict:
    timed = (cfg.steps - cfg.warmup) * cfg.global_batch
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return {
        "rank": rank,
        "losses": losses,
        "seconds": seconds,
        "images_per_s": timed / seconds,
        "checksum": sum(v.double().sum().item() for v in state.values()),
        "state": state if keep_state else None,
    }


def _ddp(model, ctx, **kwargs) -> DDP:
    """Wrap ``model`` in DDP on this rank's device (one GPU per process, or the CPU)."""
    if ctx.device.type == "cuda":
        return DDP(model, device_ids=[ctx.device], **kwargs)
    return DDP(model, **kwargs)


def train(ctx, cfg: TrainConfig) -> dict:
    """Train small_cnn with DDP on this rank's slice of each global batch.

    Returns this rank's losses, images/s (the whole global batch, timed after
    ``cfg.warmup`` steps), a parameter checksum, and the state_dict on rank 0 only.
    """
    cfg.check(ctx.world_size)
    images, labels = _dataset(cfg, ctx.device)
    torch.manual_seed(cfg.seed)  # same start on every rank (DDP also
    model = _ddp(models.small_cnn().to(ctx.device), ctx)  # broadcasts rank 0's weights)
    losses, seconds = _loop(model, cfg, images, labels, ctx.rank, ctx.world_size)
    return _result(model.module, cfg, losses, seconds, ctx.rank, ctx.rank == 0)


def reference(cfg: TrainConfig, threads: int | None = None, device="cpu") -> dict:
    """Train the same model in this one process on the whole global batch.

    ``threads`` sets torch's intra-op threads for the run, restored afterwards. On
    CUDA, TF32 is switched off in this process (as in the ranks), and stays off.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        images, labels = _dataset(cfg, torch.device(device))
        torch.manual_seed(cfg.seed)
        model = models.small_cnn().to(device)
        losses, seconds = _loop(model, cfg, images, labels, 0, 1)
    finally:
        torch.set_num_threads(before)
    return _result(model, cfg, losses, seconds, 0, True)


def _record_hook(record: list, bucket):
    """All-reduce one bucket as DDP does by default; note (bytes, ready, done) times."""
    size = bucket.buffer().numel() * bucket.buffer().element_size()
    ready = time.perf_counter()

    def done(fut):
        record.append((size, ready, time.perf_counter()))
        return fut.value()

    return default_hooks.allreduce_hook(None, bucket).then(done)


def _buckets(ctx, cap_mb: float | None, steps: int = 8) -> dict:
    """Count DDP's buckets (MB), time a step, and measure overlap for one cap.

    ``None`` is DDP's default: 25 MB, with a first bucket of 1 MB. ``spans_ms``: each
    bucket's all-reduce (ready, done) in ms after backward began (CPU clock: on GPUs,
    launch times); ``hidden``: the share of all-reduce time before backward's compute
    ended.
    """
    torch.manual_seed(0)
    model = _ddp(
        models.deep_mlp(num_layers=8, width=256).to(ctx.device),
        ctx,
        bucket_cap_mb=cap_mb,
    )
    record: list = []
    model.register_comm_hook(record, _record_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images, labels = data.random_batch(64, ctx.rank, ctx.device)
    for step in range(steps):
        if step == 2:  # buckets are rebuilt after the first step; time after
            synchronize(ctx.device)
            start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        record.clear()  # keep the last step's buckets only
        synchronize(ctx.device)   # on GPUs: time the backward, not its launch
        begin = time.perf_counter()
        loss.backward()  # returns once every bucket's all-reduce is done
        optimizer.step()
    synchronize(ctx.device)
    seconds = (time.perf_counter() - start) / (steps - 2)
    spans = sorted((ready - begin, done - begin, size) for size, ready, done in record)
    computed = spans[-1][0]  # the last bucket is ready when backward's compute ends
    hidden = sum(max(0.0, min(done, computed) - ready) for ready, done, _ in spans)
    return {
        "buckets": len(spans),
        "mb": [round(size / 2**20, 2) for *_, size in spans],
        "ms_per_step": 1000 * seconds,
        "spans_ms": [(1000 * ready, 1000 * done) for ready, done, _ in spans],
        "hidden": hidden / sum(done - ready for ready, done, _ in spans),
    }


def _no_sync(ctx, accumulation: int, micro_batch: int = 8) -> dict:
    """Accumulate gradients over micro-batches with and without no_sync; compare."""
    torch.manual_seed(0)
    model = _ddp(models.small_cnn().to(ctx.device), ctx)
    record: list = []
    model.register_comm_hook(record, _record_hook)
    images, labels = data.random_batch(accumulation * micro_batch, ctx.rank, ctx.device)
    micro = list(zip(images.split(micro_batch), labels.split(micro_batch)))
    calls = {}
    for use_no_sync in (False, True):
        model.zero_grad(set_to_none=True)
        record.clear()
        for i, (x, y) in enumerate(micro):
            last = i == len(micro) - 1
            with model.no_sync() if use_no_sync and not last else nullcontext():
                (F.cross_entropy(model(x), y) / accumulation).backward()
        calls["no_sync" if use_no_sync else "plain"] = len(record)
        accumulated = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(images), labels).backward()  # one big batch, synced once
    diff = max(
        (a - p.grad).abs().max().item() for a, p in zip(accumulated, model.parameters())
    )
    return {"allreduce_calls": calls, "max_grad_difference": diff, "model": model}


def _checkpoint(ctx, model: DDP, path: str) -> dict:
    """Save on rank 0, wait, load on every rank; return this rank's checksums."""
    if ctx.rank == 0:
        torch.save(model.module.state_dict(), path)  # .module: no "module." prefix
    dist.barrier()  # nobody reads a half-written file
    state = torch.load(path, map_location=ctx.device, weights_only=True)
    fresh = models.small_cnn().to(ctx.device)
    fresh.load_state_dict(state)

    def total(m):
        return sum(p.double().sum().item() for p in m.parameters())

    return {"trained": total(model.module), "loaded": total(fresh)}


def internals(
    ctx,
    bucket_caps_mb=(0.25, 1.0, 25.0, None),
    accumulation: int = 4,
    checkpoint_path: str = "ddp_checkpoint.pt",
) -> dict:
    """Measure DDP's buckets, accumulate with ``no_sync``, save and reload weights."""
    buckets = {cap: _buckets(ctx, cap) for cap in bucket_caps_mb}
    accumulated = _no_sync(ctx, accumulation)
    saved = _checkpoint(ctx, accumulated.pop("model"), checkpoint_path)
    return {
        "rank": ctx.rank,
        "buckets": buckets,
        "no_sync": accumulated,
        "checkpoint": saved,
    }
