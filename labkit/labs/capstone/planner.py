"""Score a plan for a real run (dp x tp x pp, micro-batches, checkpointing, ZeRO
stage): does it fit, how long is a step, where does the time go; search them all.

Taught in: lab 10 ("plan a real run", the Scaling Book's worked problems, checked).
``transformer_costs`` holds the formulas (lab 07's bytes, lab 06's alpha-beta, FLOPs),
``plan_costs`` applies them to one plan (lab 05's bubble and schedule on top); this
module says which plans are legal, prints a verdict, and searches every legal plan.

Every number it prints is a prediction from these models, not a measurement.
"""

import math
from dataclasses import dataclass

from labkit import pipeline
from labkit.labs.capstone import transformer_costs as cm
from labkit.labs.capstone import plan_costs
from labkit.labs.capstone.plan_costs import layers_per_stage
from labkit.messages import N_, _

__all__ = ["Case", "Plan", "Score", "score", "best_plans", "plan_problem",
           "layers_per_stage"]   # not first_stage_bytes: exercise 10.5's answer

KIND_NAMES = {"parameters": N_("parameters"), "gradients": N_("gradients"),
              "optimizer states": N_("optimizer states"),
              "activations": N_("activations")}   # said as _(KIND_NAMES[kind])
GIB = 2**30


@dataclass(frozen=True)
class Case:
    """A run to plan: a model, a cluster, a sequence length and a global batch
    (sequences per optimizer step)."""

    name: str
    model: cm.ModelShape
    cluster: cm.Cluster
    seq_len: int
    global_batch: int


@dataclass(frozen=True)
class Plan:
    """One layout: ``dp * tp * pp`` GPUs, the batch cut into ``num_microbatches``
    per data-parallel rank, full activation checkpointing or none, a ZeRO stage."""

    dp: int
    tp: int
    pp: int
    num_microbatches: int = 1
    checkpointing: bool = False
    zero_stage: int = 1
    schedule: str = "1f1b"
    num_chunks: int = 1

    def microbatch_size(self, case: Case) -> int:
        """Sequences in one micro-batch."""
        return case.global_batch // (self.dp * self.num_microbatches)

    def __str__(self) -> str:
        extra = f", {self.schedule} x{self.num_chunks}" if self.num_chunks > 1 else ""
        return (f"dp={self.dp} tp={self.tp} pp={self.pp} m={self.num_microbatches}"
                f" ckpt={'on' if self.checkpointing else 'off'}"
                f" zero={self.zero_stage}{extra}")


@dataclass(frozen=True)
class Memory:
    """Bytes on the fullest GPU (``stage``: its pipeline stage) and what it may use."""

    parts: dict
    usable: float
    stage: int = 0

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.usable

    @property
    def largest(self) -> str:
        return max(self.parts, key=self.parts.get)

    def __str__(self) -> str:
        parts = ", ".join(f"{_(KIND_NAMES[k])} {v / GIB:.1f}"
                          for k, v in self.parts.items())
        text = _("{total:.1f} GiB of {usable:.1f} usable on stage {stage} ({parts})"
                 ).format(total=self.total / GIB, usable=self.usable / GIB,
                          stage=self.stage, parts=parts)
        if self.fits:
            return text
        return text + _(": {over:.1f} GiB too many").format(
            over=(self.total - self.usable) / GIB)


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step, by where they go: compute, the TP all-reduces, the
    pipeline (bubble + sends) and the DP traffic compute does not hide."""

    compute: float
    tp: float
    pp: float
    dp: float

    @property
    def total(self) -> float:
        return self.compute + self.tp + self.pp + self.dp

    def parts(self) -> dict:
        return {"compute": self.compute, "TP": self.tp, "PP": self.pp, "DP": self.dp}

    def __str__(self) -> str:
        return _("{total:.2f} s per step: compute {compute:.2f}, TP {tp:.2f}, PP "
                 "(bubble + sends) {pp:.2f}, DP {dp:.2f}").format(
                     total=self.total, compute=self.compute, tp=self.tp, pp=self.pp,
                     dp=self.dp)


@dataclass(frozen=True)
class Score:
    """A plan's verdict on a case: memory, step time, throughput and MFU."""

    case: Case
    plan: Plan
    memory: Memory
    time: StepTime

    @property
    def tokens_per_s_per_gpu(self) -> float:
        tokens = self.case.global_batch * self.case.seq_len
        return tokens / self.time.total / self.case.cluster.num_gpus

    @property
    def mfu(self) -> float:
        """Model FLOPs per second per GPU over the peak (recomputation not counted)."""
        flops = self.case.model.model_flops_per_token(self.case.seq_len)
        return flops * self.tokens_per_s_per_gpu / self.case.cluster.peak_flops

    def __str__(self) -> str:
        verdict = _("fits") if self.memory.fits else _("DOES NOT FIT")
        return _("{case}, {plan} [prediction]\n  memory: {verdict}, {memory}\n"
                 "  time: {time}\n  {tps:,.0f} tokens/s per GPU, MFU {mfu:.1%}").format(
                     case=self.case.name, plan=self.plan, verdict=verdict,
                     memory=self.memory, time=self.time,
                     tps=self.tokens_per_s_per_gpu, mfu=self.mfu)


# ---------------------------------------------------------------- legality


def plan_problem(case: Case, plan: Plan) -> str | None:
    """Return why ``plan`` cannot run ``case`` (in the learner's language), or None."""
    model, gpus = case.model, case.cluster.num_gpus
    numbers = (plan.dp, plan.tp, plan.pp, plan.num_microbatches, plan.num_chunks)
    if any(type(n) is not int or n < 1 for n in numbers):
        return _("dp, tp, pp, num_microbatches and num_chunks must be positive "
                 "integers, got {numbers}.").format(numbers=numbers)
    if plan.dp * plan.tp * plan.pp != gpus:
        return _("dp x tp x pp = {used} GPUs, but the cluster has {gpus}: use them "
                 "all.").format(used=plan.dp * plan.tp * plan.pp, gpus=gpus)
    node = case.cluster.gpus_per_node
    if node % plan.tp and plan.tp % node:
        return _("tp={tp} groups would straddle the {node}-GPU nodes: use a divisor "
                 "or a multiple of {node}.").format(tp=plan.tp, node=node)
    if model.kv_heads % plan.tp or model.heads % plan.tp:
        return _("tp={tp} does not divide the {kv} key/value heads: each TP rank "
                 "needs whole heads.").format(tp=plan.tp, kv=model.kv_heads)
    if plan.zero_stage not in (0, 1, 2, 3) or plan.schedule not in pipeline.SCHEDULES:
        return _("zero_stage must be 0-3 and schedule one of {names}, got {stage!r}, "
                 "{schedule!r}.").format(names=", ".join(pipeline.SCHEDULES),
                                         stage=plan.zero_stage, schedule=plan.schedule)
    if model.layers < plan.pp * plan.num_chunks:
        return _("{layers} layers cannot fill pp x chunks = {stages} stages.").format(
            layers=model.layers, stages=plan.pp * plan.num_chunks)
    if case.global_batch % (plan.dp * plan.num_microbatches):
        return _("The global batch of {batch} sequences does not split into dp x m = "
                 "{parts} equal micro-batches.").format(
                     batch=case.global_batch, parts=plan.dp * plan.num_microbatches)
    if plan.pp > 1 and plan.num_microbatches < plan.pp:
        return _("m={m} micro-batches for pp={pp} stages: the stages never all work "
                 "at once; use m >= pp.").format(m=plan.num_microbatches, pp=plan.pp)
    if plan.num_chunks > 1 and (plan.schedule != "interleaved_1f1b" or plan.pp == 1
                                or plan.num_microbatches % plan.pp):
        return _("num_chunks > 1 needs pp > 1, schedule 'interleaved_1f1b' and m a "
                 "multiple of pp.")
    return None


def score(plan: Plan, case: Case) -> Score:
    """Score ``plan`` on ``case``; a plan that cannot run is a ValueError saying why."""
    problem = plan_problem(case, plan)
    if problem:
        raise ValueError(problem)
    stage, parts = plan_costs.memory(case, plan)
    return Score(case, plan, Memory(parts, case.cluster.usable_bytes, stage),
                 StepTime(**plan_costs.step_time(case, plan)))


# ---------------------------------------------------------------- search


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def legal_plans(case: Case, schedules=(("1f1b", 1),), zero_stages=(0, 1, 2, 3),
                where=None):
    """Yield every plan that can run ``case``: each (dp, tp, pp) using all GPUs, each
    micro-batch count, checkpointing on and off, each ZeRO stage and (schedule,
    chunks); ``where(plan)``, when given, keeps only the plans it is true for."""
    gpus = case.cluster.num_gpus
    for tp in _divisors(gpus):
        for pp in _divisors(gpus // tp):
            dp = gpus // (tp * pp)
            if case.global_batch % dp:
                continue
            for m in _divisors(case.global_batch // dp):
                for (name, chunks) in schedules:
                    for checkpointing in (False, True):
                        for zero in zero_stages:
                            plan = Plan(dp, tp, pp, m, checkpointing, zero, name,
                                        chunks)
                            if (where is None or where(plan)) and \
                                    plan_problem(case, plan) is None:
                                yield plan


def best_plans(case: Case, top: int = 5, **search) -> list[Score]:
    """The ``top`` fastest plans that fit, fastest first (ties: less memory);
    ``search``: legal_plans' keywords."""
    scores = [score(plan, case) for plan in legal_plans(case, **search)]
    fitting = [s for s in scores if s.memory.fits]
    fitting.sort(key=lambda s: (round(s.time.total, 9), s.memory.total))
    return fitting[:top]


def margin_of(got: Score, best: Score) -> float:
    """How much slower ``got`` is than ``best``: 0.10 is 10 % slower."""
    return got.time.total / best.time.total - 1 if best.time.total else math.inf
