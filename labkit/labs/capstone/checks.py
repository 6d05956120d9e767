"""Checks for lab 10 (the capstone): the GPT's block split over a TP group, DP's
bucketed all-reduce, the pipeline stage with 1F1B, and the three composed on a
2 x 2 x 2 mesh, each compared with one process.

Every check launches the learner's module on gloo CPU ranks (``pieces``, ``harness``)
and judges what the ranks computed: losses, weights after every step, gradients, and,
where the exercise is about them, the messages (how many all-reduces, when). The
hints come from that evidence (``evidence``, ``hints``); the order of the pipeline's
messages is replayed under NCCL's rules (``nccl_order``) as a warning, never a verdict.
The planning exercises (section 6) are judged on the cost models' predictions
(``plan_verdicts``); they are called from here, where ``use_reference`` finds them.
"""

import time
from dataclasses import replace

import torch

from labkit.checks._core import ExerciseFailed, passed
from labkit.checks._programs import (first_difference, launch_program, launch_programs,
                                     load_program)
from labkit.checks._reference import use_reference
from labkit.checks._solved import solved
from labkit.labs.capstone import (
    corpus,
    evidence,
    gpt,
    harness,
    hints,
    layout,
    nccl_order,
    pieces,
    plan_verdicts,
    reference,
)
from labkit.messages import N_, _

__all__ = ["use_reference", "solved", "CHECK", "LAYOUTS", "check_batches", "tp_block",
           "dp_buckets", "pipeline", "train_3d", "CLIP", "zero1_clip", "CASES", "MARGIN",
           "plans", "first_stage_bytes"]

TOLERANCE = reference.TOLERANCE
CASES, MARGIN = plan_verdicts.CASES, plan_verdicts.MARGIN   # section 6's cases
# Three blocks: 2 + 1 on two stages (uneven, as a real model's layers often are), and
# 1 + 1 + 1 on the three-stage layout, whose middle stage holds no wte. q and k start
# large (attention_std) so that attention is far from uniform: a wrong softmax scale
# or a missing causal mask moves the numbers far past the tolerance
# (tests/labs/capstone/test_sensitivity.py).
CHECK = layout.RunConfig(model=gpt.GPTConfig(context=16, width=32, num_layers=3,
                                             num_heads=4, attention_std=0.3),
                         dp=2, tp=2, pp=2, num_microbatches=4, bucket_bytes=2**13)
# The layouts train_3d runs: every subset of the mesh's dimensions switched off, and a
# pipeline of three stages (a middle stage; uneven stages are in every pp = 2 layout).
LAYOUTS = layout.layouts(CHECK) + [replace(CHECK, dp=1, tp=1, pp=3)]
STEPS, BATCH = 3, 8
GLOO_ONLY = N_("Checked on gloo CPU ranks; on NCCL the same code also needs "
               "device=ctx.device for every buffer it makes.")   # used as _()


def check_batches(seed: int = 0, steps: int = STEPS) -> torch.Tensor:
    """The check's batches: (steps, 8, 17) windows of the corpus, read here once."""
    train, _val = corpus.split(corpus.tokens())
    return corpus.batches(train, steps, BATCH, CHECK.model.context, seed)


# ---------------------------------------------------------------- exercise 10.1


def _tp_case():
    torch.manual_seed(0)
    state = gpt.build(CHECK.model).blocks[0].state_dict()
    inputs = [torch.randn(2, 8, CHECK.model.width,
                          generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    return state, inputs


def _tp_problem(rank: int, got: dict, state: dict, inputs: list) -> str | None:
    tp, group = 2, tuple(pieces.PAIRS["tp"][rank // 2])
    x = inputs[rank // 2]
    want = hints.unsplit_block(state, CHECK, x)
    if not torch.allclose(got["out"], want["out"], atol=TOLERANCE, rtol=0):
        return _("rank {rank}'s block output differs from the whole block's by "
                 "{gap:.3g}: {hint}").format(
                     rank=rank, gap=(got["out"] - want["out"]).abs().max().item(),
                     hint=hints.tp_output_hint(got, group, state, CHECK, x))
    if not torch.allclose(got["x_grad"], want["x_grad"], atol=TOLERANCE, rtol=0):
        return _("rank {rank}'s input gradient differs from the whole block's by "
                 "{gap:.3g}: {hint}").format(
                     rank=rank, gap=(got["x_grad"] - want["x_grad"]).abs().max().item(),
                     hint=hints.tp_input_grad_hint(got, want, tp))
    shards = {name: layout.tp_part(name, grad, rank % 2, tp)
              for name, grad in want["grads"].items()}
    held = layout.canonical(got["grads"], shards)
    unused = sorted(set(got.get("no_grad", ())) & set(shards))
    if unused:
        return _("rank {rank}'s {names} got no gradient: its forward never used it (a "
                 "bias added on one rank only, before the sum?). The output can still "
                 "be right, but that copy never learns, and in the 3-D mesh its DP "
                 "bucket never fires. Add each bias on every rank, once, after the "
                 "all-reduce.").format(rank=rank, names=", ".join(unused))
    gap = first_difference(shards, held, TOLERANCE)
    if gap:
        return _("rank {rank}'s gradient of {tensor} differs from its block of the "
                 "whole block's by {gap:.3g}. Keep each shard as a parameter named as "
                 "in gpt.Block (attn.q.weight, mlp.fc2.bias, ...).").format(
                     rank=rank, tensor=gap[0], gap=gap[1])
    return None


def tp_block(path="tp_gpt.py") -> None:
    """Check the learner's parallelize_block on 4 gloo ranks: two TP pairs, each on its
    own input, against the whole gpt.Block in this process."""
    name = "tp_block"
    module = load_program(path)
    state, inputs = _tp_case()
    ranks = launch_program(name, pieces.run_tp_block, 4,
                           args=(module.__name__, CHECK, state, inputs),
                           module=module.__name__, explain=hints.explain_rank,
                           timeout=60, hang_hint=_(
                               "Do both ranks of a TP pair all-reduce in the same "
                               "places, on the group they were given?"))
    for rank, got in enumerate(ranks):
        problem = _tp_problem(rank, got, state, inputs)
        if problem:
            raise ExerciseFailed(f"{name}: {problem}")
    forward = sum(e["phase"] == "forward" for e in ranks[0]["comm"])
    backward = sum(e["phase"] == "backward" for e in ranks[0]["comm"])
    passed(name, _("2 heads per rank: output, input gradient and every shard's "
                   "gradient equal the whole block's to {tolerance:g}, with "
                   "{forward} all-reduces forward and {backward} backward per block, "
                   "each over its TP pair.").format(tolerance=TOLERANCE,
                                                    forward=forward, backward=backward))


# ---------------------------------------------------------------- exercise 10.2

DP_ONLY = replace(CHECK, dp=2, tp=1, pp=1)


def _dp_gap(ranks, batches, refs, accumulations_index) -> str | None:
    for pair, members in enumerate(pieces.PAIRS["dp"]):
        run = [ranks[r]["runs"][accumulations_index] for r in members]
        ref = refs[pair]   # one process, on this pair's batches
        gap = evidence.first_gap(DP_ONLY, run, ref, losses=False)
        if gap is None:
            continue
        if run[0]["unwaited"]:
            return _("{count} bucket(s) were never waited for: wait() must wait for "
                     "every bucket launched in this step.").format(
                         count=run[0]["unwaited"])
        differ = evidence.replicas_differ(DP_ONLY, run, gap.step)
        scale = evidence.scale_of(DP_ONLY, run, batches[pair], [2.0, 0.5, 4.0])
        hint = {2.0: _("The gradients are 2 x the mean: the sum over the DP group. "
                       "Divide by the group's size, dist.get_world_size(group)."),
                0.5: _("The gradients are half the mean: divided by the world size "
                       "(4), not by the group's (2).")}.get(scale)
        if differ and hint is None:
            hint = _("ranks {a} and {b} hold different {tensor}: a replica stepped on "
                     "gradients that were not (all) averaged yet.").format(
                         a=members[differ[0]], b=members[differ[1]], tensor=differ[2])
        return _("DP pair {pair}: {gap}. {hint}").format(
            pair=members, gap=gap.text(), hint=hint or "")
    return None


def dp_buckets(path="dp_buckets.py") -> None:
    """Check the learner's Buckets: two DP pairs side by side train the whole GPT for 3
    steps (1 and 2 backward passes per step); weights must equal one process, and the
    messages must show buckets launched during backward."""
    name = "dp_buckets"
    module = load_program(path)
    batches = [check_batches(seed) for seed in (0, 1)]
    ranks = launch_program(name, pieces.run_dp, 4,
                           args=(module.__name__, CHECK, batches),
                           module=module.__name__, timeout=60, hang_hint=_(
                               "Does every rank launch the same buckets in the same "
                               "order, on the group it was given?"))
    refs = [evidence.one_process(DP_ONLY, pair_batches) for pair_batches in batches]
    for index, accumulations in enumerate((1, 2)):
        problem = _dp_gap(ranks, batches, refs, index) or hints.dp_behaviour(
            ranks[0], accumulations)
        if problem:
            raise ExerciseFailed(_("{name}, {acc} backward pass(es) per step: "
                                   "{problem}").format(name=name, acc=accumulations,
                                                       problem=problem))
    steps = hints.dp_messages(ranks[0]["comm"], 1)
    during, total, nbytes, _blocking = steps[0]
    passed(name, _("weights equal one process to {tolerance:g} (3 steps, 1 and 2 "
                   "backward passes per step); {total} buckets per step for "
                   "{params} parameters ({kib:.0f} KiB), {during} of them launched "
                   "during backward.").format(tolerance=TOLERANCE, total=total,
                                              params=ranks[0]["params"],
                                              kib=nbytes / 2**10, during=during))


# ---------------------------------------------------------------- exercise 10.3

PP_ONLY = replace(CHECK, dp=1, tp=1, pp=2)


def pipeline(path="pp_gpt.py", bound_s: float = 15.0) -> None:
    """Check the learner's Stage, one_f_one_b and sync_tied: two 2-stage pipelines side
    by side train the GPT for 3 steps, m = 4; losses and weights must equal one
    process, and each stage must run 1F1B's order of forwards and backwards (lab 05's
    table: right numbers come from any order)."""
    name = "pipeline"
    module = load_program(path)
    batches = [check_batches(seed) for seed in (0, 1)]
    ranks = launch_program(name, pieces.run_pp, 4,
                           args=(module.__name__, CHECK, batches, bound_s),
                           module=module.__name__, timeout=60,
                           explain=hints.explain_rank)
    for pair, members in enumerate(pieces.PAIRS["pp"]):
        run = [ranks[r] for r in members]
        problem = evidence.diagnose(PP_ONLY, run, batches[pair],
                                    evidence.one_process(PP_ONLY, batches[pair]))
        if problem:
            raise ExerciseFailed(_("{name}: pipeline {pair}: {problem}").format(
                name=name, pair=members, problem=problem))
    for rank, got in enumerate(ranks):
        problem = evidence.order_problem(got["order"], got["pp_rank"], PP_ONLY.pp,
                                         PP_ONLY.num_microbatches)
        if problem:
            raise ExerciseFailed(_("{name}: right numbers, but on rank {rank} {problem}"
                                   ).format(name=name, rank=rank, problem=problem))
    held = ranks[0]["peak_held"]
    passed(name, _("2 stages, m = 4: losses and weights equal one process to "
                   "{tolerance:g} for 3 steps; stage 0 held at most {held} "
                   "micro-batches.").format(tolerance=TOLERANCE, held=held)
           + _nccl_warning(ranks[0]["messages"], ranks[2]["messages"], (0, 2)))


def _nccl_warning(first: list, second: list, pair: tuple) -> str:
    stall = nccl_order.deadlock(nccl_order.items(first), nccl_order.items(second))
    return "" if stall is None else "\n⚠️  " + nccl_order.describe(stall, pair)


# ---------------------------------------------------------------- exercise 10.4


def _dimension_hint(rows: list) -> str:
    """Which dimension(s) every failing layout has, and every passing one lacks."""
    failing = [cfg for cfg, problem in rows if problem]
    blamed = [dim for dim in layout.DIMS
              if all(getattr(cfg, dim) > 1 for cfg in failing)
              and all(getattr(cfg, dim) == 1 for cfg, problem in rows if not problem)]
    if not blamed:
        alone = [cfg for cfg, _problem in rows if cfg.world_size == 1]
        if alone and alone[0] in failing:
            return _("It fails with every dimension switched off too (one rank): look "
                     "at what every layout shares (the micro-batches, the step).")
        return _("No one dimension explains it: {failing} of {total} layouts fail, "
                 "and the first one's message above names what differs.").format(
                     failing=len(failing), total=len(rows))
    pieces_of = {"tp": "checks.tp_block(\"tp_gpt.py\")",
                 "dp": "checks.dp_buckets(\"dp_buckets.py\")",
                 "pp": "checks.pipeline(\"pp_gpt.py\")"}
    return _("Every layout with {dims} > 1 fails, every other passes: the mistake is "
             "in that dimension's part ({check} tries it alone, with more detail), or "
             "in how the Trainer uses it.").format(
                 dims=" and ".join(blamed),
                 check=", ".join(pieces_of[dim] for dim in blamed))


def waves(configs: list, most_ranks: int) -> list[list]:
    """Pack layouts into launches that run together, at most ``most_ranks`` ranks each
    (largest first, each into the first wave with room): the check's 30 ranks in 9
    layouts make 4 waves of 8, 8, 8 and 6 ranks."""
    packed = []
    for cfg in sorted(configs, key=lambda c: -c.world_size):
        room = next((wave for wave in packed
                     if sum(c.world_size for c in wave) + cfg.world_size <= most_ranks),
                    None)
        if room is None:
            packed.append([cfg])
        else:
            room.append(cfg)
    return packed


def _runnable(layouts: list) -> list:
    """The layouts asked for, each one the check can run, or a clear refusal."""
    for cfg in layouts:
        if not isinstance(cfg, layout.RunConfig):
            raise ExerciseFailed(_("train_3d: layouts must be layout.RunConfig, e.g. "
                                   "replace(checks.CHECK, dp=2, tp=1, pp=4); got "
                                   "{value!r}.").format(value=cfg))
        if cfg.world_size > CHECK.world_size:
            raise ExerciseFailed(_("train_3d: {name} needs {n} ranks; the check runs "
                                   "at most {most} at once. Choose dp x tp x pp <= "
                                   "{most}.").format(name=cfg.name, n=cfg.world_size,
                                                     most=CHECK.world_size))
        if BATCH % (cfg.dp * cfg.num_microbatches):
            raise ExerciseFailed(_("train_3d: {name} with m = {m}: the check's batch of "
                                   "{batch} sequences does not split into dp x m = "
                                   "{parts} equal micro-batches. Choose dp x m dividing "
                                   "{batch}.").format(name=cfg.name,
                                                      m=cfg.num_microbatches,
                                                      batch=BATCH,
                                                      parts=cfg.dp * cfg.num_microbatches))
    return layouts


def _train_layouts(name: str, trainer_module: str, module: str, layouts: list,
                   batches, options) -> dict:
    """{layout: its ranks' results}: ``trainer_module``'s Trainer trained on each of
    ``layouts`` (``harness.run_trainer``), in ``waves``; ``module`` is the learner's
    file the check is about (named in a failure)."""
    found = {}
    for wave in waves(layouts, CHECK.world_size):
        results = launch_programs(name, harness.run_trainer,
                                  [(cfg.world_size, (trainer_module, cfg, batches,
                                                     options)) for cfg in wave],
                                  module=module, timeout=60, explain=hints.explain_rank,
                                  names=[cfg.name for cfg in wave])
        found.update(zip(wave, results))
    return found


def train_3d(path="gpt3d.py", bound_s: float = 15.0, layouts=None) -> None:
    """Check the learner's Trainer on the 2 x 2 x 2 mesh, on every layout with some
    dimensions switched off, and on a pipeline of three stages (``LAYOUTS``: 9
    layouts, 1 to 8 ranks; ``layouts`` to run others, e.g. 2 x 1 x 4 on a 5-block
    GPT): losses and weights after each of 3 steps must equal one process, each DP
    replica must read its own share of the batch, and each stage run 1F1B's order.

    The layouts run a few at a time (``waves``), as many ranks at once as the whole
    mesh: on a machine shared by a room, 8 ranks at a time get the cores sooner
    than one or two do, and the check waits for 4 launches, not 9.
    """
    name = "train_3d"
    layouts = LAYOUTS if layouts is None else _runnable(list(layouts))
    module = load_program(path)
    batches = check_batches()
    start = time.perf_counter()
    found = _train_layouts(name, module.__name__, module.__name__, layouts, batches,
                           harness.Options(bound_s=bound_s))
    seconds = time.perf_counter() - start
    rows = [(cfg, evidence.diagnose(cfg, found[cfg], batches,
                                    evidence.one_process(cfg, batches)))
            for cfg in layouts]
    table = "\n".join(f"  {cfg.name} ({cfg.world_size} rank(s)): " + (problem or "✓")
                      for cfg, problem in rows)
    if any(problem for _cfg, problem in rows):
        raise ExerciseFailed(_("{name}: not every layout equals one process:\n{table}\n"
                               "{hint}").format(name=name, table=table,
                                                hint=_dimension_hint(rows)))
    passed(name, _("all {count} layouts equal one process to {tolerance:g} (losses and "
                   "every shard, 3 steps), in {seconds:.1f} s:\n{table}\n{gloo}").format(
                       count=len(layouts), tolerance=TOLERANCE, seconds=seconds,
                       table=table, gloo=_(GLOO_ONLY))
           + _pipeline_warning(layouts, found))


def _pipeline_warning(layouts: list, found: dict) -> str:
    """The NCCL replay of the first pipeline pair of the largest layout with pp > 1."""
    piped = [cfg for cfg in layouts if cfg.pp > 1]
    if not piped:
        return ""
    cfg = max(piped, key=lambda c: c.world_size)
    first, second = (layout.rank_of(cfg, layout.Coords(s, 0, 0)) for s in (0, 1))
    return _nccl_warning(found[cfg][first]["messages"], found[cfg][second]["messages"],
                         (first, second))


# ---------------------------------------------------------------- exercise 10.7

CLIP = 1.0   # below the check GPT's gradient norm at every step (1.7-2.2): all clip
# The whole mesh (each rule of the global norm and ZeRO-1's sharding shows there, and
# each mistake gives its own norm) and the pipeline with a middle stage.
ZERO1_LAYOUTS = [replace(cfg, max_norm=CLIP) for cfg in (CHECK, LAYOUTS[-1])]


def _norm_hint(cfg, step: int, got: float, batches) -> str:
    """Name the mistake a wrong global norm at step 0 points to (its candidates)."""
    if step:
        return ""
    grads = reference.gradients(cfg, batches[0])["grads"]
    squares = {name: g.double().pow(2).sum().item() for name, g in grads.items()}
    total = sum(squares.values())
    split = sum(v for n, v in squares.items() if layout.is_split(n))
    candidates = [
        (cfg.tp > 1, split + cfg.tp * (total - split), _(
            "It counted the tensors every TP rank holds whole (the norms, out's and "
            "fc2's biases, the embeddings) {tp} times: add the split shards' squares "
            "over the TP group, and the whole tensors once.").format(tp=cfg.tp)),
        (cfg.pp > 1, total + squares["wte.weight"], _(
            "It counted the tied wte twice: the last stage's copy is the same "
            "parameter (its gradient already summed); count it on one stage only.")),
        (cfg.dp > 1, cfg.dp * total, _(
            "It summed over the DP group too: after the buckets every DP replica "
            "holds the same averaged gradient; count it once.")),
    ]
    for applies, squared, text in candidates:
        if applies and abs(got - squared ** 0.5) <= 1e-4 * squared ** 0.5:
            return " " + text
    return ""


def _norm_problem(cfg, ranks: list, ref: dict, batches) -> str | None:
    for rank, got in enumerate(ranks):
        for step, (mine, want) in enumerate(zip(got.get("norms", []), ref["norms"])):
            if abs(mine - want) > TOLERANCE * want:
                return _("after step {step}'s backward, rank {rank}'s global_grad_norm "
                         "returned {got:.6g}; the whole GPT's gradient norm is "
                         "{want:.6g} (clip_grad_norm_ in one process).{hint}").format(
                             step=step, rank=rank, got=mine, want=want,
                             hint=_norm_hint(cfg, step, mine, batches))
    return None


def _sharding_problem(cfg, ranks: list) -> str | None:
    if cfg.dp == 1:
        return None
    differ = evidence.replicas_differ(cfg, ranks, 0)
    if differ:
        return _("after step 0, DP ranks {a} and {b} hold different {tensor}: each "
                 "stepped its own share of the parameters, but the shares were not sent "
                 "to the others. After the step, every parameter goes from its owner to "
                 "the whole DP group (dist.broadcast from the owner, or an "
                 "all-gather).").format(a=differ[0], b=differ[1], tensor=differ[2])
    for rank, got in enumerate(ranks):
        if got["optimizer_bytes"] >= got["param_bytes"]:
            return _("rank {rank} keeps {held:,} bytes of optimizer states for "
                     "{params:,} bytes of parameters: the whole of its stage's, as "
                     "without ZeRO-1. Each DP rank keeps the states of its share only "
                     "(about 1/dp = 1/{dp}), steps that share, then sends it to the "
                     "others.").format(rank=rank, held=got["optimizer_bytes"],
                                       params=got["param_bytes"], dp=cfg.dp)
    return None


def zero1_clip(path="zero1_clip.py", bound_s: float = 15.0) -> None:
    """Check the learner's ShardedOptimizer (ZeRO-1 over the DP group) and
    global_grad_norm (clipping by the whole model's norm): the Trainer of exercise
    10.4 (gpt3d.py) trains ``ZERO1_LAYOUTS`` with it, every step clipped to
    ``CLIP``; the norms, losses and weights must equal one process with
    torch.nn.utils.clip_grad_norm_, and each DP rank must keep less than the whole
    of its stage's optimizer states."""
    name = "zero1_clip"
    module = load_program(path)
    batches = check_batches()
    options = harness.Options(bound_s=bound_s, sharded=module.__name__)
    layouts = ZERO1_LAYOUTS
    found = _train_layouts(name, "gpt3d", module.__name__, layouts, batches, options)
    for cfg in layouts:
        ref = evidence.one_process(cfg, batches)
        problem = (_sharding_problem(cfg, found[cfg])
                   or _norm_problem(cfg, found[cfg], ref, batches)
                   or evidence.diagnose(cfg, found[cfg], batches, ref))
        if problem:
            raise ExerciseFailed(_("{name} ({layout}): {problem}").format(
                name=name, layout=cfg.name, problem=problem))
    full = found[ZERO1_LAYOUTS[0]][0]
    passed(name, _("{count} layouts equal one process clipping to {clip:g} at every "
                   "step (norms, losses, weights to {tolerance:g}). Optimizer states on "
                   "rank 0 of the 2 x 2 x 2 mesh: {held:,} bytes, {share:.0%} of the "
                   "{whole:,} it would keep without ZeRO-1 (lab 07's model: 1/dp = "
                   "{model:.0%}; whole tensors are not cut, so the shares are not "
                   "exactly equal).").format(
                       count=len(layouts), clip=CLIP, tolerance=TOLERANCE,
                       held=full["optimizer_bytes"],
                       share=full["optimizer_bytes"] / full["param_bytes"],
                       whole=full["param_bytes"], model=1 / CHECK.dp))


def plans(choose_plans) -> None:
    """Check ``choose_plans() -> {case name: planner.Plan}``: every plan fits and is
    within ``MARGIN`` of the fastest plan the models find (``plan_verdicts``)."""
    plan_verdicts.plans(choose_plans)


def first_stage_bytes(fn) -> None:
    """Check ``fn(case, plan) -> {kind: bytes}`` for a GPU of the first pipeline
    stage against the planner's model on several plans (``plan_verdicts``)."""
    plan_verdicts.first_stage_bytes(fn)
