"""What a run on ranks shows against one process: where it first differs, and which
classic mistake the numbers point to.

Taught in: lab 10 (the checks' hints). Every hint here comes from what the ranks
computed (losses, weights after each step, the collectives they sent), never from
the learner's source: gradients k times too large train exactly like k times the
learning rate (SGD), so a run that equals the reference at lr x dp summed its DP
gradients; replicas that disagree stepped before their all-reduce finished; a stage
holding the wrong tensors is named by the names it holds.
"""

from dataclasses import dataclass

import torch

from labkit import pipeline
from labkit.checks._programs import first_difference
from labkit.labs.capstone import layout, reference
from labkit.messages import _

__all__ = ["Gap", "first_gap", "names_problem", "scale_of", "replicas_differ",
           "loss_hint", "order_problem", "reading_problem", "one_process", "diagnose"]


@dataclass(frozen=True)
class Gap:
    """The first difference from one process: ``what`` is "loss" or a tensor's name."""

    step: int
    rank: int
    what: str
    size: float

    def text(self) -> str:
        if self.what == "loss":
            return _("the loss of step {step} on rank {rank} is off by {size:.3g}"
                     ).format(step=self.step, rank=self.rank, size=self.size)
        return _("after step {step}, rank {rank}'s {tensor} is off by {size:.3g}"
                 ).format(step=self.step, rank=self.rank, tensor=self.what,
                          size=self.size)


def _loss_gap(cfg, ranks, ref, step) -> Gap | None:
    for rank, got in enumerate(ranks):
        if layout.coords(cfg, rank).pp != cfg.pp - 1:
            continue   # only the last stage knows the loss
        value = got["losses"][step]
        want = ref["losses"][step]
        if value is None or not abs(value - want) <= reference.TOLERANCE * abs(want):
            return Gap(step, rank, "loss", float("inf") if value is None
                       else abs(value - want))
    return None


def first_gap(cfg, ranks: list, ref: dict, losses: bool = True) -> Gap | None:
    """Return the first difference of a run from ``ref`` (``reference.train``), step
    by step: the loss of the step (last stage; not when ``losses`` is False), then
    every rank's weights after it."""
    for step in range(len(ref["losses"])):
        gap = _loss_gap(cfg, ranks, ref, step) if losses else None
        if gap:
            return gap
        for rank, got in enumerate(ranks):
            want = layout.shard(ref["weights"][step], cfg, rank)
            diff = first_difference(want, got["snapshots"][step], reference.TOLERANCE)
            if diff:
                return Gap(step, rank, *diff)
    return None


def names_problem(cfg, ranks: list, start: dict) -> str | None:
    """Say what a rank holds that its stage should not, or lacks (None: all right)."""
    for rank, got in enumerate(ranks):
        want = set(layout.shard(start, cfg, rank))
        held = set(got["snapshots"][0]) if got["snapshots"] else set()
        where = layout.coords(cfg, rank)
        extra, missing = sorted(held - want), sorted(want - held)
        if not extra and not missing:
            continue
        if "wpe.weight" in extra or "wpe.weight" in missing:
            return _("rank {rank} (pipeline stage {stage} of {pp}) {has} the position "
                     "embedding wpe: it belongs on the FIRST stage only, added to the "
                     "token embedding before block 0 (every later stage receives "
                     "activations that already carry the positions).").format(
                         rank=rank, stage=where.pp, pp=cfg.pp,
                         has=_("holds") if "wpe.weight" in extra else _("lacks"))
        blocks = sorted({int(n.split(".")[1]) for n in held if n.startswith("blocks.")})
        wanted = list(layout.stage_blocks(cfg, where.pp))
        if blocks and blocks != wanted:
            return _("rank {rank} (pipeline stage {stage}) holds blocks {blocks}, "
                     "expected {wanted}: keep each block under its index in the whole "
                     "GPT (nn.ModuleDict({{'2': block}}) names it blocks.2...), and "
                     "give stage s the blocks s*L/pp ... (s+1)*L/pp - 1.").format(
                         rank=rank, stage=where.pp, blocks=blocks, wanted=wanted)
        return _("rank {rank} (pipeline stage {stage} of {pp}) holds {extra} it "
                 "should not and lacks {missing}. The first stage holds wte and wpe, "
                 "the last ln_f and its own copy of wte (the tied output layer), "
                 "every stage its blocks, named as in the whole GPT.").format(
                     rank=rank, stage=where.pp, pp=cfg.pp, extra=extra or _("nothing"),
                     missing=missing or _("nothing"))
    return None


def one_f_one_b(p: int, m: int, stage: int) -> list:
    """Stage ``stage``'s 1F1B order of p stages and m micro-batches: [("F", 0), ...]
    (lab 05's table, ``labkit.pipeline``)."""
    return [(a.kind, a.microbatch) for a in pipeline.orders("1f1b", p, m)[stage]]


def _most_held(order: list) -> int:
    held = most = 0
    for kind, _microbatch in order:
        held += 1 if kind == "F" else -1
        most = max(most, held)
    return most


def order_problem(order: list, stage: int, p: int, m: int) -> str | None:
    """Say how a stage's order of forwards and backwards (timeline.Watch's) differs
    from 1F1B's (None: it is 1F1B)."""
    want = one_f_one_b(p, m, stage)
    if not order or order == want:
        return None
    warmup = min(p - stage - 1, m)
    held = _most_held(order)
    if held == m and m > p - stage:
        kind = _("that is fill-drain (GPipe)")
    elif held < min(p - stage, m):
        kind = _("too few warm-up forwards: the stages wait for each other, one "
                 "micro-batch at a time")
    else:
        kind = _("another order than 1F1B's")
    text = " ".join(f"{k}{i}" for k, i in order)
    return _("stage {stage} of {p} ran {got} (at most {held} micro-batches' "
             "activations held at once): {kind}. 1F1B runs min(p - stage - 1, m) = "
             "{warmup} warm-up forward(s), then one forward and one backward in turn, "
             "then the cool-down backwards: {want} (lab 05's table), holding at most "
             "{most}.").format(stage=stage, p=p, got=text, held=held, kind=kind,
                              warmup=warmup, most=min(p - stage, m),
                              want=" ".join(f"{k}{i}" for k, i in want))


def _schedule_problem(cfg, ranks: list) -> str | None:
    if cfg.pp == 1:
        return None   # one stage: micro-batches are plain gradient accumulation
    for rank, got in enumerate(ranks):
        stage = layout.coords(cfg, rank).pp
        for order in got.get("orders", []):
            problem = order_problem(order, stage, cfg.pp, cfg.num_microbatches)
            if problem:
                return _("rank {rank}: {problem}").format(rank=rank, problem=problem)
    return None


def reading_problem(cfg, ranks: list, batches) -> str | None:
    """Say how the token micro-batches the first stages read differ from each DP
    replica's own share of the batch, cut into m (None: right, or not seen)."""
    m, rows = cfg.num_microbatches, batches.shape[1]
    size = rows // (cfg.dp * m)
    for step, batch in enumerate(batches):
        inputs, owner = batch[:, :-1], {}
        for dp_rank in range(cfg.dp):
            rank = layout.rank_of(cfg, layout.Coords(0, dp_rank, 0))
            read = ranks[rank].get("read", [])
            if step >= len(read) or not read[step]:
                return None   # the stage never saw the tokens as its input
            shapes = {tuple(mb.shape) for mb in read[step]}
            if len(read[step]) != m or shapes != {(size, inputs.shape[1])}:
                whole = _(" (every replica read the whole batch?)") if any(
                    shape[0] == rows // m for shape in shapes) and cfg.dp > 1 else ""
                return _("rank {rank} (DP rank {dp_rank} of {dp}) read {count} "
                         "micro-batch(es) of shape {shapes} in step {step}; each DP "
                         "replica takes its own {share} of the batch's {rows} "
                         "sequences (tokens.chunk(dp)[dp_rank]) and cuts them into m = "
                         "{m} micro-batches of ({size}, {seq}): inputs w[:, :-1], "
                         "targets w[:, 1:].{whole}").format(
                             rank=rank, dp_rank=dp_rank, dp=cfg.dp,
                             count=len(read[step]), shapes=sorted(shapes), step=step,
                             share=rows // cfg.dp, rows=rows, m=m, size=size,
                             seq=inputs.shape[1], whole=whole)
            for mb in read[step]:
                for row in mb:
                    where = (inputs == row).all(dim=1).nonzero().flatten().tolist()
                    index = where[0] if where else None
                    if index in owner and owner[index] != dp_rank:
                        return _("DP ranks {a} and {b} both trained on sequence {row} "
                                 "of step {step}'s batch: each replica takes a "
                                 "disjoint share, tokens.chunk(dp)[dp_rank] with its "
                                 "own rank on the DP group.").format(
                                     a=owner[index], b=dp_rank, row=index, step=step)
                    owner[index] = dp_rank
        if None in owner or len(owner) != rows:
            return _("in step {step} the DP replicas read {count} of the batch's {rows} "
                     "sequences: together their shares must make the whole batch."
                     ).format(step=step, count=len(owner.keys() - {None}), rows=rows)
    return None


def _no_grad_problem(ranks: list) -> str | None:
    for rank, got in enumerate(ranks):
        if got.get("no_grad"):
            return _("rank {rank}'s {names} got no gradient: this rank holds it but its "
                     "forward never used it (a bias added on one rank only?). Its "
                     "copies on the other ranks then step differently, and a DP bucket "
                     "holding it never fires. Use every parameter on every rank: add "
                     "a TP bias on each rank, after the all-reduce.").format(
                         rank=rank, names=", ".join(got["no_grad"]))
    return None


def _weights_equal(cfg, ranks: list, ref: dict, step: int = -1,
                   leaving_out: str | None = None) -> bool:
    """Whether every rank's weights after ``step`` equal one process's (all but the
    tensor ``leaving_out``)."""
    for rank, got in enumerate(ranks):
        want = layout.shard(ref["weights"][step], cfg, rank)
        held = dict(got["snapshots"][step])
        for named in (want, held):
            named.pop(leaving_out, None)
        if first_difference(want, held, reference.TOLERANCE) is not None:
            return False
    return True


_ONE_PROCESS: dict = {}   # (run, scale, batches) -> reference.train's result


def one_process(cfg, batches, scale: float = 1.0) -> dict:
    """``reference.train`` of ``cfg``'s model and optimizer on ``batches``, with the
    learning rate times ``scale``, computed once: every layout of a check, and every
    hint that asks "k x the gradients?", shares it (the mesh does not change it)."""
    run = (cfg.model, cfg.optimizer, cfg.lr, cfg.momentum, cfg.max_norm)
    key = (run, float(scale), batches.shape, hash(batches.numpy().tobytes()))
    if key not in _ONE_PROCESS:
        if len(_ONE_PROCESS) > 32:
            _ONE_PROCESS.clear()
        _ONE_PROCESS[key] = reference.train(cfg, batches, scale)
    return _ONE_PROCESS[key]


def scale_of(cfg, ranks: list, batches, candidates: list) -> float | None:
    """Return the k of ``candidates`` for which the run equals one process trained
    with k x the learning rate (gradients k times too large), or None."""
    for scale in candidates:
        if scale != 1 and _weights_equal(cfg, ranks, one_process(cfg, batches, scale)):
            return scale
    return None


def replicas_differ(cfg, ranks: list, step: int) -> tuple | None:
    """Return (rank a, rank b, tensor) of two DP replicas of one shard that hold
    different weights after ``step``, or None when all replicas agree."""
    for rank, got in enumerate(ranks):
        where = layout.coords(cfg, rank)
        if where.dp != 0:
            continue
        for other in layout.group_ranks(cfg, rank, "dp")[1:]:
            mine, theirs = got["snapshots"][step], ranks[other]["snapshots"][step]
            for name in mine:
                if name in theirs and not torch.equal(mine[name], theirs[name]):
                    return rank, other, name
    return None


def loss_hint(cfg, ranks: list, ref: dict, step: int, batches) -> str | None:
    """Explain a wrong loss from the numbers: None returned, the replicas' own
    losses, or m times the batch's (with or without m times the gradients)."""
    last = [r for r in range(cfg.world_size) if layout.coords(cfg, r).pp == cfg.pp - 1]
    got = [ranks[r]["losses"][step] for r in last]
    want = ref["losses"][step]
    if any(value is None for value in got):
        return _("rank {rank} is on the last stage but returned None: return the "
                 "step's loss there (a float).").format(rank=last[got.index(None)])
    if abs(sum(got) / len(got) - want) <= reference.TOLERANCE * want and cfg.dp > 1:
        return _("Each last-stage rank returned its own replica's loss; their mean is "
                 "the batch's. All-reduce the loss over the DP group and divide by "
                 "dp = {dp}.").format(dp=cfg.dp)
    m = cfg.num_microbatches
    if m > 1 and all(abs(m * value - want) <= reference.TOLERANCE * want
                     for value in got):
        return _("The loss is 1/{m} of the batch's: each micro-batch's loss was "
                 "divided by m = {m} (right, for its backward) and the sum divided by m "
                 "again. Return the sum of the loss_i / m.").format(m=m)
    if not all(abs(value - m * want) <= reference.TOLERANCE * m * want
               for value in got):
        return None
    if scale_of(cfg, ranks, batches, [float(m)]):
        return _("The loss is {m} x the batch's, and so is every gradient: the "
                 "micro-batches' losses were added up, not averaged. Divide each "
                 "micro-batch's loss by m = {m} before its backward.").format(m=m)
    return _("The loss is {m} x the batch's (the gradients are right): return the sum "
             "of the divided losses, loss_i / m.").format(m=m)


def _tied_copies_differ(cfg, ranks: list, step: int) -> bool:
    for rank in range(cfg.world_size):
        where = layout.coords(cfg, rank)
        if cfg.pp > 1 and where.pp == 0:
            last = layout.rank_of(cfg, layout.Coords(cfg.pp - 1, where.dp, where.tp))
            mine = ranks[rank]["snapshots"][step].get("wte.weight")
            theirs = ranks[last]["snapshots"][step].get("wte.weight")
            both = mine is not None and theirs is not None
            if both and not torch.equal(mine, theirs):
                return True
    return False


def _weights_hint(cfg, ranks: list, batches, gap: Gap, ref: dict) -> str | None:
    m = cfg.num_microbatches
    scale = scale_of(cfg, ranks, batches, [float(cfg.dp), float(m), float(cfg.dp * m)])
    if scale == cfg.dp * m and cfg.dp > 1:
        return _("the gradients are dp x m = {scale:g} x one process's: DP summed "
                 "them, and the micro-batch losses were not divided by m.").format(
                     scale=scale)
    if scale == cfg.dp and cfg.dp > 1:
        return _("the gradients are dp = {dp} x one process's: summed over the DP "
                 "group, not averaged. Divide by the DP group's size.").format(
                     dp=cfg.dp)
    if scale == m:
        return _("the gradients are m = {m} x one process's: divide each micro-batch's "
                 "loss by m before its backward.").format(m=m)
    if cfg.dp > 1 and (any(r.get("unwaited") for r in ranks)
                       or replicas_differ(cfg, ranks, gap.step)):
        return _("DP replicas of one shard now hold different weights: each stepped "
                 "on its own, un-averaged gradients. Wait for every bucket "
                 "(buckets.wait()) BEFORE optimizer.step().")
    if gap.what == "wte.weight" and _tied_copies_differ(cfg, ranks, gap.step):
        return _("the first and the last stage's copies of the tied wte disagree: its "
                 "gradient has two parts, the first stage's lookup and the last "
                 "stage's output layer; sync_tied must add them up on both, after "
                 "the DP buckets are waited for.")
    if gap.what == "wte.weight" and cfg.pp > 1 and _weights_equal(
            cfg, ranks, ref, gap.step, leaving_out="wte.weight"):
        return _("both copies of the tied wte agree, but took the wrong step, and every "
                 "other weight is right: its two gradients (the first stage's lookup, "
                 "the last stage's output layer) must be ADDED (all_reduce with SUM "
                 "over the first and the last stage), not averaged, and not one "
                 "copied over the other.")
    return None


def diagnose(cfg, ranks: list, batches, ref: dict) -> str | None:
    """Say where a run on ranks first differs from one process, and the classic
    mistake the numbers point to; None when it equals one process.

    Equal numbers are not enough: every DP replica must read its own share of the
    batch (training each on the whole batch gives the same numbers, dp times the
    work), and a pipeline must run 1F1B's order (no warm-up gives the same numbers,
    one stage at a time)."""
    problem = (names_problem(cfg, ranks, ref["start"])
               or reading_problem(cfg, ranks, batches)
               or _schedule_problem(cfg, ranks))
    if problem:
        return problem
    gap = first_gap(cfg, ranks, ref)
    if gap is None:
        return None
    unused = _no_grad_problem(ranks)
    if unused:
        return f"{gap.text()}: {unused}"
    if gap.what == "loss":
        hint = loss_hint(cfg, ranks, ref, gap.step, batches) or _reported_loss_hint(
            cfg, ranks, ref, gap.step)
        return f"{gap.text()}. {hint}"
    hint = _weights_hint(cfg, ranks, batches, gap, ref)
    return f"{gap.text()}: {hint}" if hint else gap.text()


def _reported_loss_hint(cfg, ranks: list, ref: dict, step: int) -> str:
    """A wrong loss: is it only the number returned (the weights are right)?"""
    if _weights_equal(cfg, ranks, ref, step):
        return _("Every weight after the step equals one process, so forward and "
                 "backward are right: only the loss returned is off. Return the global "
                 "batch's mean: on the last stage the sum of the micro-batches' "
                 "loss_i / m (each already divided by m once), then the DP replicas' "
                 "mean.")
    return _("The forward pass already differs (the loss of step {step}).").format(
        step=step)
