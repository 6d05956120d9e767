"""A model cut into stages, one per rank: what every rank builds, the unsplit model the
checks compare with, and the rank workers that run a learner's stage program.

Taught in: lab 04 (layer-wise model parallelism over send/recv) and lab 05 (GPipe and
1F1B on ranks). The programs are written in the notebooks (``%%writefile``); here every
rank builds the same ``deep_mlp`` from the same seed and keeps its own slice, calls the
learner's function, and ``timeline.Watch`` records what its stage did: the order of
forwards and backwards, when each ran, the activations held. Checks add
``p2p.bounded``: a rank that waits too long for a message stops and says which.
"""

import importlib
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from labkit import data, models, p2p, pipeline, timeline, train
from labkit.messages import _

__all__ = ["split_stages", "Config", "Program", "whole_model", "batch", "requests", "reference",
           "run_program", "run_serve"]


def split_stages(model: nn.Sequential, num_stages: int) -> list[nn.Sequential]:
    """Cut an ``nn.Sequential`` into stages holding equal numbers of weighted layers."""
    weighted = [i for i, layer in enumerate(model) if list(layer.parameters())]
    if not 1 <= num_stages <= len(weighted):
        raise ValueError(_("Cannot cut {layers} weighted layer(s) into {num_stages} "
                           "stages: use 1 to {layers} stages.").format(
                               layers=len(weighted), num_stages=num_stages))
    per_stage = [len(weighted) // num_stages + (s < len(weighted) % num_stages)
                 for s in range(num_stages)]
    cuts, taken = [0], 0
    for count in per_stage[:-1]:
        taken += count
        cuts.append(weighted[taken])   # a stage starts at its first weighted layer
    cuts.append(len(model))
    return [model[a:b] for a, b in zip(cuts, cuts[1:])]


@dataclass(frozen=True)
class Config:
    """The model every rank builds (from ``seed``) and the batch of one step."""

    num_layers: int = 8
    width: int = 256        # every cut carries (batch, width) activations
    batch: int = 64
    num_microbatches: int = 1
    seed: int = 0


CALLS = ("batch", "microbatches", "order")   # how run_program calls the function


@dataclass(frozen=True)
class Program:
    """Which function of the learner's module ``run_program`` calls, and how.

    ``call`` "batch": ``fn(ctx, stage, images, labels, width)``; "microbatches":
    ``fn(ctx, stage, microbatches, width)``; "order": ``fn(ctx, stage, microbatches,
    order, width)``. ``warmup`` runs one unrecorded step first (first calls allocate).
    ``bound_s`` (checks): stop a rank that waits longer than this for a message.
    """

    module: str
    function: str
    call: str = "batch"
    steps: int = 1
    warmup: bool = False
    bound_s: float | None = None

    def __post_init__(self):
        if self.call not in CALLS:
            raise ValueError(_("Program.call must be one of {choices}, got "
                               "{call!r}.").format(choices=", ".join(CALLS),
                                                   call=self.call))


def whole_model(cfg: Config):
    """Return the unsplit model: the same weights on every rank and in the parent."""
    torch.manual_seed(cfg.seed)
    return models.deep_mlp(cfg.num_layers, cfg.width)


def _stage(ctx, cfg: Config):
    return split_stages(whole_model(cfg), ctx.world_size)[ctx.rank].to(ctx.device)


def batch(cfg: Config, device="cpu"):
    """Return the (images, labels) of one step: the same on every rank."""
    return data.random_batch(cfg.batch, cfg.seed + 1, device)


def requests(cfg: Config, count: int) -> torch.Tensor:
    """Return ``count`` single-image requests, (count, 1, 1, 28, 28), from the seed."""
    generator = torch.Generator().manual_seed(cfg.seed + 2)
    return torch.randn(count, 1, 1, 28, 28, generator=generator)


def reference(cfg: Config) -> dict:
    """Return the unsplit model's loss, logits and gradients on the whole batch."""
    model = whole_model(cfg)
    images, labels = batch(cfg)
    logits = model(images)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    return {"loss": loss.item(), "logits": logits.detach(),
            "grads": {name: p.grad for name, p in model.named_parameters()}}


def _grads(stage) -> dict:
    return {name: p.grad.detach().cpu().clone()
            for name, p in stage.named_parameters() if p.grad is not None}


# ---------------------------------------------------------------- rank workers


def _call(fn, ctx, stage, cfg: Config, call: str, order):
    """Call the learner's function the way ``Program.call`` says."""
    images, labels = batch(cfg, ctx.device)
    if call == "batch":
        return fn(ctx, stage, images, labels, cfg.width)
    microbatches = pipeline.split_microbatches(images, labels, cfg.num_microbatches)
    if call == "microbatches":
        return fn(ctx, stage, microbatches, cfg.width)
    return fn(ctx, stage, microbatches, order, cfg.width)


def _run(ctx, fn, program: Program, cfg: Config, order, guard, index: int) -> dict:
    """Run the learner's step (warm-up, then recorded steps) on a fresh stage."""
    stage, events = _stage(ctx, cfg), []
    for step in range(-int(program.warmup), program.steps):
        if guard is not None:
            guard.phase = [index, step]   # orders the waits of stuck ranks
        stage.zero_grad(set_to_none=True)
        first = max(step, 0) * cfg.num_microbatches   # label events across steps
        with timeline.Watch(stage, ctx.rank, ctx.device, first) as watch:
            loss = _call(fn, ctx, stage, cfg, program.call, order)
        if step >= 0:
            events += watch.events
    return {"grads": _grads(stage), "loss": None if loss is None else float(loss),
            "order": watch.order, "events": events, "peak_held": watch.peak_held,
            "peak_bytes": watch.peak_bytes}


def run_program(ctx, program: Program, cfgs: list, orders: list | None = None) -> dict:
    """Rank worker: run the learner's ``program`` once per config in ``cfgs``.

    ``orders[i]`` (call "order"): every rank's order of ("F", i)/("B", i) for
    ``cfgs[i]``. Returns this rank's runs (gradients of the last step, loss on the
    last rank, executed order, events, activations held) and its messages (checks).
    """
    log: list = []
    bounded = (p2p.bounded(ctx.rank, program.bound_s, log) if program.bound_s
               else nullcontext())
    with bounded as guard:   # imported inside: `from torch.distributed import send`
        fn = getattr(importlib.import_module(program.module), program.function)
        runs = [_run(ctx, fn, program, cfg, orders[i][ctx.rank] if orders else None,
                     guard, i) for i, cfg in enumerate(cfgs)]
    return {"rank": ctx.rank, "device": str(ctx.device), "runs": runs, "messages": log}


def run_serve(ctx, module: str, cfg: Config, count: int,
              bound_s: float | None = None) -> dict:
    """Rank worker: answer ``count`` requests with the learner's ``serve``.

    Rank 0 returns the answers and the time of each request in ms (the others:
    empty lists); every rank returns the messages it sent and received (checks).
    """
    stage = _stage(ctx, cfg).eval()
    answers, graphs, latencies, log = [], [], [], []
    bounded = p2p.bounded(ctx.rank, bound_s, log) if bound_s else nullcontext()
    with bounded as guard:   # imported inside, as in run_program
        serve = importlib.import_module(module).serve
        for index, request in enumerate(requests(cfg, count).to(ctx.device)):
            if guard is not None:
                guard.phase = index   # orders the waits of stuck ranks
            train.synchronize(ctx.device)
            start = time.perf_counter()
            answer = serve(ctx, stage, request, cfg.width)
            train.synchronize(ctx.device)
            latencies.append((time.perf_counter() - start) * 1e3)
            graphs.append(torch.is_tensor(answer) and answer.requires_grad)
            answers.append(answer.detach().cpu() if torch.is_tensor(answer) else answer)
    first = ctx.rank == 0
    return {"rank": ctx.rank, "answers": answers if first else [],
            "answer_requires_grad": graphs if first else [],
            "latency_ms": latencies if first else [], "messages": log}
