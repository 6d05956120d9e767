"""Gradient compression (梯度压缩) with DDP communication hooks, side by side: the bytes
each hook hands to the network per step, the step time, and the test accuracy after
the same training budget.

Taught in: lab 06 section 3; ``labkit bench compression``. Hooks are named by a short
spec: ``"allreduce"`` (what DDP does by default, through Python so it can be
counted), ``"fp16"``, ``"bf16"``, ``"powersgd-R"`` (rank R), or a tuple
``(label, module, function, dtype)`` for a hook the learner wrote, called with that
dtype as its state.
"""

import importlib
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit import data, models, train
from labkit.messages import _

__all__ = ["ByteCounter", "CompressionConfig", "make_hook", "label", "train_variants"]

ONE_BUCKET_MB = 100   # more than any model of this lab: every gradient in one bucket


class ByteCounter:
    """Count the bytes (and calls) this rank hands to ``all_reduce`` / ``all_gather``.

    DDP's hooks call them through the ``torch.distributed`` module, so replacing the
    module's functions inside ``with counter:`` sees every call. ``link_gbytes_per_s``
    emulates a slower link: each call also waits for its bytes x 2(N-1)/N to cross
    it (a ring all-reduce sends that much per rank).
    """

    def __init__(self, link_gbytes_per_s: float | None = None):
        self.link = link_gbytes_per_s
        self.bytes = self.calls = 0
        self._saved = None

    def _count(self, tensor) -> None:
        n_bytes = tensor.numel() * tensor.element_size()
        self.bytes += n_bytes
        self.calls += 1
        if self.link:
            world_size = dist.get_world_size()
            time.sleep(n_bytes * 2 * (world_size - 1) / world_size / (self.link * 1e9))

    def __enter__(self):
        self._saved = (dist.all_reduce, dist.all_gather)
        all_reduce, all_gather = self._saved

        def counted_all_reduce(tensor, *args, **kwargs):
            work = all_reduce(tensor, *args, **kwargs)
            self._count(tensor)
            return work

        def counted_all_gather(outputs, tensor, *args, **kwargs):
            work = all_gather(outputs, tensor, *args, **kwargs)
            self._count(tensor)
            return work

        dist.all_reduce, dist.all_gather = counted_all_reduce, counted_all_gather
        return self

    def __exit__(self, *exc):
        dist.all_reduce, dist.all_gather = self._saved


@dataclass(frozen=True)
class CompressionConfig:
    """One training budget that every hook gets: same model, data, steps and seed."""

    steps: int = 300
    batch_per_rank: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    width: int = 512              # deep_mlp(3, width): 784-512-512-10, 0.67 M params
    limit: int | None = 20000     # MNIST training images
    test_limit: int | None = None  # MNIST test images (None: all 10,000)
    powersgd_start: int = 30      # PowerSGD's warm-up: plain all-reduce until then
    slow_link_gbytes_per_s: float = 0.125   # the emulated link: 1 Gbit/s Ethernet
    slow_steps: int = 10          # extra steps timed on it
    seed: int = 0


def label(spec) -> str:
    """Return the name a hook spec is shown under."""
    return spec[0] if isinstance(spec, tuple) else spec


def make_hook(spec, cfg: CompressionConfig):
    """Return ``(state, hook)`` for ``register_comm_hook`` from a hook spec."""
    if isinstance(spec, tuple):
        _label, module, function, dtype = spec
        return getattr(torch, dtype), getattr(importlib.import_module(module), function)
    if spec == "allreduce":
        return None, default_hooks.allreduce_hook
    if spec in ("fp16", "bf16"):
        return None, getattr(default_hooks, f"{spec}_compress_hook")
    if spec.startswith("powersgd-"):
        state = powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(spec.split("-")[1]),
            start_powerSGD_iter=cfg.powersgd_start, use_error_feedback=True,
            warm_start=True, random_seed=cfg.seed)
        return state, powersgd.powerSGD_hook
    raise ValueError(_("Unknown hook {spec!r}: use 'allreduce', 'fp16', 'bf16', "
                       "'powersgd-R' (R = 1, 2, 4, ...) or (label, module, function, "
                       "dtype).").format(spec=spec))


def _batches(cfg: CompressionConfig, num_samples: int, world_size: int, steps: int):
    """Yield each step's global batch of indices, identical on every rank."""
    gen = torch.Generator().manual_seed(cfg.seed)
    per_step = cfg.batch_per_rank * world_size
    for _ in range(steps):
        yield torch.randint(num_samples, (per_step,), generator=gen)


def _accuracy(ctx, model, test) -> float:
    """Test accuracy, each rank scoring its own half of the test set."""
    mine = data.DeviceData(test.images[ctx.rank::ctx.world_size],
                           test.labels[ctx.rank::ctx.world_size])
    counts = torch.tensor([train.evaluate(model, mine.batches(1000, shuffle=False))
                           * len(mine), len(mine)], dtype=torch.float64,
                          device=ctx.device)
    dist.all_reduce(counts)   # outside any ByteCounter: evaluation is not training
    return (counts[0] / counts[1]).item()


def _run(ctx, model, optimizer, batches, images, labels, counter) -> tuple:
    """Train on this rank's slice of each global batch; return [(bytes, seconds)]."""
    per_step = []
    for index in batches:
        mine = index[ctx.rank::ctx.world_size]
        before = counter.bytes
        train.synchronize(ctx.device)
        start = time.perf_counter()
        with counter:
            train.train_step(model, images[mine], labels[mine], optimizer)
        train.synchronize(ctx.device)
        per_step.append((counter.bytes - before, time.perf_counter() - start))
    return per_step


def _one(ctx, spec, cfg: CompressionConfig, train_split, test) -> dict:
    """Train one hook for the budget, then time a few steps on the emulated link."""
    torch.manual_seed(cfg.seed)
    module = models.deep_mlp(num_layers=3, width=cfg.width).to(ctx.device)
    # One bucket: on gloo, PowerSGD's chained all-reduces from several buckets can
    # reach the ranks in different orders (gloo: "Received data size doesn't match").
    model = DDP(module, device_ids=[ctx.device] if ctx.device.type == "cuda" else None,
                bucket_cap_mb=ONE_BUCKET_MB)
    model.register_comm_hook(*make_hook(spec, cfg))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    images, labels = train_split.images, train_split.labels
    steps = _run(ctx, model, optimizer,
                 _batches(cfg, len(labels), ctx.world_size, cfg.steps), images, labels,
                 ByteCounter())
    accuracy = _accuracy(ctx, module, test)
    slow = _run(ctx, model, optimizer, _batches(cfg, len(labels), ctx.world_size,
                                                cfg.slow_steps), images, labels,
                ByteCounter(cfg.slow_link_gbytes_per_s))
    timed = steps[cfg.powersgd_start + 1:] or steps[-1:]   # steady state only
    return {"name": label(spec), "bytes_first_step": steps[0][0],
            "bytes_per_step": steps[-1][0],
            "ms_per_step": 1e3 * sorted(s for _, s in timed)[len(timed) // 2],
            "slow_link_ms": 1e3 * sorted(s for _, s in slow)[len(slow) // 2],
            "accuracy": accuracy, "backend": ctx.backend}


def train_variants(ctx, cfg: CompressionConfig, specs) -> list[dict]:
    """Train the MLP once per hook spec with DDP (same seed, data and steps).

    Each result: bytes this rank handed to all-reduce in the first and the last step,
    median ms per step after PowerSGD's warm-up (on this machine's link), median ms
    per step on the emulated slow link, and the test accuracy after ``cfg.steps``.
    """
    train_split = data.DeviceData.mnist(train=True, device=ctx.device, limit=cfg.limit)
    test = data.DeviceData.mnist(train=False, device=ctx.device, limit=cfg.test_limit)
    return [_one(ctx, spec, cfg, train_split, test) for spec in specs]


def _error_of(fn) -> str:
    """Call ``fn``; return the first line of what it raised or warned, or ""."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn()
        except Exception as err:   # the point is to show the message
            return f"{type(err).__name__}: {str(err).splitlines()[0]}"
    return (f"{caught[0].category.__name__}: {str(caught[0].message).splitlines()[0]}"
            if caught else "")


def hook_pitfalls(ctx) -> dict:
    """Make the classic hook mistakes on purpose; return each exact message.

    The keys stay English: they name the mistakes for the code that reads them.
    """
    from torch.distributed.algorithms.model_averaging import averagers

    images, labels = data.random_batch(8, ctx.rank)

    def step_with(hook, twice=False):
        torch.manual_seed(0)
        model = DDP(models.deep_mlp(num_layers=2, width=16))
        model.register_comm_hook(None, hook)
        if twice:
            model.register_comm_hook(None, hook)
        F.cross_entropy(model(images), labels).backward()

    def work_future(state, bucket):   # the future of the work: its value is a list
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future()

    def a_tensor(state, bucket):      # a tensor, not a future
        dist.all_reduce(bucket.buffer())
        return bucket.buffer()

    return {
        _("registered twice"): _error_of(
            lambda: step_with(default_hooks.allreduce_hook, twice=True)),
        _("future of the work"): _error_of(lambda: step_with(work_future)),
        _("tensor returned"): _error_of(lambda: step_with(a_tensor)),
        _("PowerSGD from step 1"): _error_of(lambda: powersgd.PowerSGDState(
            None, start_powerSGD_iter=1)),
        _("averaging period 1"): _error_of(lambda: averagers.PeriodicModelAverager(1)),
    }
