"""The rank workers that try each piece of the capstone alone: the TP block, the DP
buckets, the pipeline stage. Each builds what the learner's piece needs, calls it,
and returns what the rank computed (the checks compare it with one process).

Taught in: lab 10 (exercises 10.1-10.3). Every worker runs on 4 gloo ranks as two
groups of two side by side, each group on its own data: a piece that talks to the
whole world instead of its group mixes the two groups' numbers, and shows.
"""

import importlib
from contextlib import ExitStack

import torch
import torch.distributed as dist

from labkit import timeline
from labkit.labs.capstone import gpt, reference
from labkit.labs.capstone.harness import (Options, call_learner, local_weights,
                                          recorders)

__all__ = ["PAIRS", "pairs", "run_tp_block", "run_dp", "run_pp"]

# The two groups of each worker: neighbours for TP, ranks 2 apart for DP and PP (as
# in the 2 x 2 x 2 mesh, where the pipeline's pairs are 4 apart).
PAIRS = {"tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]], "pp": [[0, 2], [1, 3]]}


def pairs(kind: str, rank: int):
    """Make both groups of ``kind`` (every rank must); return (group, its index)."""
    made = [dist.new_group(ranks) for ranks in PAIRS[kind]]
    index = next(i for i, ranks in enumerate(PAIRS[kind]) if rank in ranks)
    return made[index], index


def _block_grads(block) -> dict:
    return {name: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
            .detach().cpu().clone() for name, p in block.named_parameters()
            if p.grad is not None}


def run_tp_block(ctx, module_name: str, cfg, state: dict, inputs: list) -> dict:
    """Split one gpt.Block over this rank's TP pair; run ``inputs[pair]`` forward and
    back with the loss (out * probe).sum(). Returns out, x_grad, the shards' gradients
    and the all-reduces of each phase."""
    group, index = pairs("tp", ctx.rank)
    with ExitStack() as stack:
        recorder, _guard, _messages = recorders(ctx, Options(lazy=False), stack)
        module = importlib.import_module(module_name)
        block = gpt.Block(cfg.model.width, cfg.model.num_heads)
        block.load_state_dict(state)
        call_learner(module.parallelize_block, module_name, block, group)
        block = block.to(ctx.device)
        x = inputs[index].to(ctx.device).requires_grad_()
        recorder.phase = "forward"
        out = call_learner(block, module_name, x)
        recorder.phase = "backward"
        (out * probe(out.shape).to(ctx.device)).sum().backward()
    return {"out": out.detach().cpu(), "x_grad": x.grad.cpu(),
            "grads": _block_grads(block), "comm": recorder.log,
            "no_grad": [name for name, p in block.named_parameters()
                        if p.requires_grad and p.grad is None]}


def probe(shape, seed: int = 1) -> torch.Tensor:
    """A fixed random tensor: the loss (out * probe).sum() uses every output."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _dp_run(ctx, module, name, cfg, batches, accumulations, group, recorder):
    """Train the whole GPT, averaging with the learner's Buckets; snapshot each step."""
    model = gpt.build(cfg.model).to(ctx.device)
    buckets = call_learner(module.Buckets, name, model.parameters(), group,
                           cfg.bucket_bytes, accumulations=accumulations)
    optimizer = reference.make_optimizer(model.parameters(), cfg)
    share = dist.get_rank(group)
    found = {"snapshots": [], "losses": [], "unwaited": 0, "start": len(recorder.log)}
    for step, tokens in enumerate(batches):
        recorder.phase = (accumulations, step, "backward")
        optimizer.zero_grad(set_to_none=True)
        mine = tokens.chunk(dist.get_world_size(group))[share].to(ctx.device)
        total = 0.0
        for part in mine.chunk(accumulations):
            loss = reference.step_loss(model, part) / accumulations
            loss.backward()
            total += loss.item()
        recorder.phase = (accumulations, step, "wait")
        call_learner(buckets.wait, name)
        recorder.phase = (accumulations, step, "step")
        optimizer.step()
        found["unwaited"] += recorder.flush()
        found["losses"].append(total)
        found["snapshots"].append(local_weights(model, cfg))
    return found


def run_dp(ctx, module_name: str, cfg, batches: list, accumulations=(1, 2)) -> dict:
    """Train with the learner's ``Buckets`` in this rank's DP pair, on
    ``batches[pair]``, once per count of ``accumulations`` (backward passes per step).
    Returns each run's snapshots and the all-reduces, with their phase."""
    group, index = pairs("dp", ctx.rank)
    with ExitStack() as stack:
        recorder, _guard, _messages = recorders(ctx, Options(), stack)
        module = importlib.import_module(module_name)
        runs = [_dp_run(ctx, module, module_name, cfg, batches[index], count, group,
                        recorder) for count in accumulations]
    return {"runs": runs, "comm": recorder.log, "pair": index,
            "param_bytes": sum(p.numel() * p.element_size()
                               for p in gpt.build(cfg.model).parameters()),
            "params": len(list(gpt.build(cfg.model).parameters()))}


def run_pp(ctx, module_name: str, cfg, batches: list, bound_s: float = 15.0) -> dict:
    """Train the GPT as 2 stages (the learner's Stage, one_f_one_b, sync_tied) in this
    rank's pipeline pair, on ``batches[pair]``. Returns losses, snapshots, the order
    of the stage's forwards and backwards, its peak of micro-batches held, and the
    messages (with batch markers)."""
    group, index = pairs("pp", ctx.rank)
    pp_rank, pp_size = dist.get_rank(group), dist.get_world_size(group)
    found = {"losses": [], "snapshots": [], "pair": index, "pp_rank": pp_rank}
    with ExitStack() as stack:
        recorder, guard, messages = recorders(ctx, Options(bound_s=bound_s), stack)
        module = importlib.import_module(module_name)
        stage = call_learner(module.Stage, module_name, gpt.build(cfg.model), pp_rank,
                             pp_size).to(ctx.device)
        optimizer = reference.make_optimizer(stage.parameters(), cfg)
        for step, tokens in enumerate(batches[index]):
            guard.phase = step
            optimizer.zero_grad(set_to_none=True)
            tokens = tokens.to(ctx.device)
            microbatches = [(w[:, :-1], w[:, 1:])
                            for w in tokens.chunk(cfg.num_microbatches)]
            shape = (*microbatches[0][0].shape, cfg.model.width)
            with timeline.Watch(stage, ctx.rank, ctx.device) as watch:
                loss = call_learner(module.one_f_one_b, module_name, stage,
                                    microbatches, shape, group)
            call_learner(module.sync_tied, module_name, stage, group)
            optimizer.step()
            found["losses"].append(None if loss is None else float(loss))
            found["snapshots"].append(local_weights(stage, cfg))
    found.update(order=watch.order, peak_held=watch.peak_held, messages=messages,
                 comm=recorder.log)
    return found
