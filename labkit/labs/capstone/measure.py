"""The capstone's measurements, as rank workers and the summaries of what they return:
bucketed vs plain DP all-reduce, the pipeline's bubble, and the messages and bytes
of each mesh dimension counted from the real collectives.

Taught in: lab 10 (sections 3-5). Workers time with ``time.perf_counter`` (CPU
ranks; on a GPU they synchronise first) and return raw times; the notebook prints
medians and spreads next to the theory (``cost_model``).
"""

import importlib
import time

import torch
import torch.distributed as dist

from labkit import pipeline, timeline, train
from labkit.labs.capstone import gpt, layout, reference
from labkit.labs.capstone.harness import call_learner

__all__ = ["plain_average", "flat_average", "dp_overlap", "bubble", "bubble_fractions",
           "traffic",
           "spread"]


def plain_average(params, group) -> None:
    """Lab 03's average, after backward: one blocking all-reduce per gradient."""
    size = dist.get_world_size(group)
    for param in params:
        dist.all_reduce(param.grad, group=group)
        param.grad /= size


def flat_average(params, group) -> None:
    """One bucket, after backward: every gradient in one all-reduce, not overlapped."""
    params = list(params)
    flat = torch.cat([p.grad.flatten() for p in params])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for param in params:
        param.grad.copy_(flat[offset:offset + param.numel()].view_as(param.grad))
        offset += param.numel()


def _dp_step(model, optimizer, tokens, average) -> float:
    train.synchronize(tokens.device)
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    reference.step_loss(model, tokens).backward()
    average()
    optimizer.step()
    train.synchronize(tokens.device)
    return time.perf_counter() - start


def dp_overlap(ctx, module_name: str, cfg, batches: torch.Tensor, rounds: int) -> dict:
    """Rank worker (DP over every rank): seconds per step with the plain average (one
    all-reduce per gradient), with one flat all-reduce after backward, and with the
    learner's Buckets, in alternating rounds of ``len(batches)`` steps (the first step
    of each round is not timed). Same model, same batches for all three."""
    module = importlib.import_module(module_name)
    group = dist.group.WORLD
    mine = batches.chunk(ctx.world_size, dim=1)[ctx.rank].to(ctx.device)
    runs = {}
    for kind in ("plain", "flat", "buckets"):
        model = gpt.build(cfg.model).to(ctx.device)
        optimizer = reference.make_optimizer(model.parameters(), cfg)
        if kind != "buckets":
            average = plain_average if kind == "plain" else flat_average
            runs[kind] = (model, optimizer, lambda m=model, f=average: f(
                m.parameters(), group))
        else:
            buckets = call_learner(module.Buckets, module_name, model.parameters(),
                                   group, cfg.bucket_bytes)
            runs[kind] = (model, optimizer, buckets.wait)
    times = {kind: [] for kind in runs}
    for _round in range(rounds):
        for kind, (model, optimizer, average) in runs.items():
            seconds = [_dp_step(model, optimizer, tokens, average) for tokens in mine]
            times[kind] += seconds[1:]
    return times


def bubble(ctx, module_name: str, cfg, tokens: torch.Tensor, counts: list,
           steps: int = 2) -> dict:
    """Rank worker (a pipeline over every rank): for each micro-batch count in
    ``counts``, the learner's 1F1B step; returns this rank's F/B events of its last
    step per count (``timeline.Event``: row = rank, start/end in seconds)."""
    module = importlib.import_module(module_name)
    group = dist.group.WORLD
    stage = call_learner(module.Stage, module_name, gpt.build(cfg.model), ctx.rank,
                         ctx.world_size).to(ctx.device)
    tokens = tokens.to(ctx.device)
    found = {}
    for m in counts:
        microbatches = [(w[:, :-1], w[:, 1:]) for w in tokens.chunk(m)]
        shape = (*microbatches[0][0].shape, cfg.model.width)
        for _step in range(steps):
            stage.zero_grad(set_to_none=True)
            dist.barrier()
            with timeline.Watch(stage, ctx.rank, ctx.device) as watch:
                call_learner(module.one_f_one_b, module_name, stage, microbatches,
                             shape, group)
        found[m] = watch.events
    return found


def bubble_fractions(ranks: list) -> dict:
    """{m: idle share of the pipeline's span} from ``bubble``'s results, both ranks'
    events together (their clocks are the machine's)."""
    return {m: pipeline.bubble_fraction([e for r in ranks for e in r[m]])
            for m in ranks[0]}


def traffic(cfg, rank: int, comm: list, messages: list, steps: int) -> dict:
    """Count one rank's collectives and messages per step, by mesh dimension.

    Returns {dim: {"all_reduces", "all_reduce_bytes", "sent_bytes", "messages",
    "message_bytes"}}: payload bytes as passed; ``sent_bytes`` what a ring sends of
    them, 2(n-1)/n of each all-reduce over n ranks. All-reduces over one rank (a
    dimension switched off) are not counted: they send nothing.
    """
    groups = {tuple(layout.group_ranks(cfg, rank, dim)): dim for dim in layout.DIMS
              if getattr(cfg, dim) > 1}
    found = {dim: dict.fromkeys(("all_reduces", "all_reduce_bytes", "sent_bytes",
                                 "messages", "message_bytes"), 0.0)
             for dim in layout.DIMS + ("other",)}
    for entry in comm:
        if entry["op"] != "all_reduce" or len(entry["ranks"]) == 1:
            continue   # a group of one rank sends nothing
        dim = groups.get(entry["ranks"], "other")
        n = len(entry["ranks"])
        found[dim]["all_reduces"] += 1 / steps
        found[dim]["all_reduce_bytes"] += entry["bytes"] / steps
        found[dim]["sent_bytes"] += entry["bytes"] * 2 * (n - 1) / n / steps
    for entry in messages:
        if entry["op"] in ("send", "isend"):
            found["pp"]["messages"] += 1 / steps
            found["pp"]["message_bytes"] += entry["bytes"] / steps
            found["pp"]["sent_bytes"] += entry["bytes"] / steps
    return found


def spread(values) -> tuple:
    """(median, first quartile, third quartile) of ``values``."""
    ordered = torch.tensor(sorted(values), dtype=torch.float64)
    return tuple(torch.quantile(ordered, q).item() for q in (0.5, 0.25, 0.75))
