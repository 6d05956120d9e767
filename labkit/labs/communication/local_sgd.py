"""Local SGD (本地SGD) and "asynchronous updates" (异步更新): train alone, average the
parameters every few steps; and what staleness does to plain SGD.

Taught in: lab 06 section 4. The learner writes ``average_parameters`` and the
averaging step of ``train`` (exercise 6.3); ``train`` here is labkit's copy, the
reference the check compares with. ``sweep`` runs the learner's ``train`` for several
periods plus PyTorch's post-local SGD (``PostLocalSGDState`` and
``PeriodicModelAverager``), counting the bytes; ``stale_sgd`` simulates a parameter
server whose gradients arrive ``delay`` steps late, in one process.
"""

import collections
import copy
import importlib
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_local
from torch.distributed.algorithms.model_averaging import averagers
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit import data, models, train as training
from labkit.labs.communication.compression import ByteCounter
from labkit.messages import _

__all__ = ["Config", "my_shard", "make_model", "batches", "train", "sweep",
           "stale_sgd"]


@dataclass(frozen=True)
class Config:
    """One local-SGD run: every rank trains ``steps`` steps on its own shard."""

    steps: int = 240          # a multiple of the period, so the run ends averaged
    period: int = 4           # average the parameters every ``period`` steps (H)
    batch_per_rank: int = 32
    lr: float = 0.05
    seed: int = 0
    limit: int = 8192         # MNIST training images, split between the ranks
    width: int = 128          # deep_mlp(3, width)


def my_shard(ctx, cfg: Config):
    """Return this rank's (images, labels): every world_size-th training image."""
    split = data.DeviceData.mnist(train=True, device=ctx.device, limit=cfg.limit)
    return (split.images[ctx.rank::ctx.world_size],
            split.labels[ctx.rank::ctx.world_size])


def make_model(cfg: Config, device="cpu"):
    """Return the MLP, seeded: every rank starts from the same weights."""
    torch.manual_seed(cfg.seed)
    return models.deep_mlp(num_layers=3, width=cfg.width).to(device)


def batches(ctx, cfg: Config, num_samples: int):
    """Yield ``cfg.steps`` batches of indices into this rank's shard, its own order."""
    gen = torch.Generator().manual_seed(cfg.seed + 1000 * (ctx.rank + 1))
    for _ in range(cfg.steps):
        yield torch.randint(num_samples, (cfg.batch_per_rank,), generator=gen)


def _average_parameters(model) -> None:
    """Replace every parameter by its mean over the ranks."""
    with torch.no_grad():
        for param in model.parameters():
            dist.all_reduce(param)
            param /= dist.get_world_size()


def _weights(model) -> dict:
    return {name: t.detach().cpu().clone() for name, t in model.state_dict().items()}


def train(ctx, cfg: Config) -> dict:
    """Local SGD, labkit's copy of the exercise: average every ``cfg.period`` steps.

    Returns this rank's final weights and the number of averaging rounds.
    """
    images, labels = my_shard(ctx, cfg)
    model = make_model(cfg, ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    rounds = 0
    for step, index in enumerate(batches(ctx, cfg, len(labels))):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images[index]), labels[index]).backward()
        optimizer.step()
        if (step + 1) % cfg.period == 0:   # after the step: the run ends averaged
            _average_parameters(model)
            rounds += 1
    return {"state": _weights(model), "rounds": rounds}


def _post_local_sgd(ctx, cfg: Config, warmup: int) -> dict:
    """PyTorch's post-local SGD: DDP for ``warmup`` steps, then local SGD.

    After the warm-up the hook stops all-reducing gradients
    (``post_local_gradient_allreduce=False``) and ``PeriodicModelAverager`` averages
    the parameters every ``cfg.period`` steps.
    """
    images, labels = my_shard(ctx, cfg)
    model = DDP(make_model(cfg, ctx.device),
                device_ids=[ctx.device] if ctx.device.type == "cuda" else None)
    state = post_local.PostLocalSGDState(process_group=None, subgroup=None,
                                         start_localSGD_iter=warmup,
                                         post_local_gradient_allreduce=False)
    model.register_comm_hook(state, post_local.post_localSGD_hook)
    averager = averagers.PeriodicModelAverager(period=cfg.period, warmup_steps=warmup)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    for index in batches(ctx, cfg, len(labels)):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images[index]), labels[index]).backward()
        optimizer.step()
        averager.average_parameters(model.parameters())
    return {"state": _weights(model.module)}


def sweep(ctx, module: str, cfg: Config, periods, warmup: int) -> list[dict]:
    """Run ``module.train`` once per period, then post-local SGD; count the bytes.

    Each result: name, period, bytes this rank handed to all-reduce, and this rank's
    final weights (local SGD ends averaged; post-local SGD's averager may not: its
    last round falls where (step - warmup) % period == 0).
    """
    learner = importlib.import_module(module)
    results = []
    for period in periods:
        run = replace(cfg, period=period)
        with ByteCounter() as counter:
            out = learner.train(ctx, run)
        results.append({"name": _("local SGD, H={period}").format(period=period),
                        "period": period, "bytes": counter.bytes,
                        "state": out["state"]})
    with ByteCounter() as counter:
        out = _post_local_sgd(ctx, cfg, warmup)
    results.append({"name": _("post-local SGD (torch), {warmup} DDP steps, then "
                              "H={period}").format(warmup=warmup, period=cfg.period),
                    "period": cfg.period, "bytes": counter.bytes,
                    "state": out["state"]})
    return results


def stale_sgd(delay: int, steps: int, lr: float, train_split, test_split,
              batch_size: int = 64, seed: int = 0) -> dict:
    """Simulate asynchronous SGD: each gradient is computed on weights ``delay``
    steps old (a parameter server with ``delay`` other workers pushing in between).

    One process, one model: the staleness is the only difference from plain SGD
    (``delay=0``). Returns the test accuracy and the mean loss of the last 50 steps.
    Runs on one thread (restored afterwards): for this small MLP more threads only
    wait for each other, badly so on a busy machine.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _stale_sgd(delay, steps, lr, train_split, test_split, batch_size, seed)
    finally:
        torch.set_num_threads(before)


def _stale_sgd(delay, steps, lr, train_split, test_split, batch_size, seed) -> dict:
    torch.manual_seed(seed)
    model = models.deep_mlp(num_layers=3, width=128)
    worker = copy.deepcopy(model)   # the copy a worker computes its gradient on
    history = collections.deque([copy.deepcopy(model.state_dict())], maxlen=delay + 1)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        worker.load_state_dict(history[0])   # the oldest weights: ``delay`` steps old
        index = torch.randint(len(train_split), (batch_size,), generator=gen)
        worker.zero_grad(set_to_none=True)
        loss = F.cross_entropy(worker(train_split.images[index]),
                               train_split.labels[index])
        loss.backward()
        with torch.no_grad():   # the server applies the stale gradient to today's
                                # weights
            for param, stale in zip(model.parameters(), worker.parameters()):
                param -= lr * stale.grad
        history.append(copy.deepcopy(model.state_dict()))
        losses.append(loss.item())
    tail = losses[-50:]
    return {"delay": delay, "lr": lr, "loss": sum(tail) / len(tail),
            "accuracy": training.evaluate(model, test_split.batches(1000,
                                                                     shuffle=False))}
