"""What lab 10's "plan a real run" checks judge (``checks.plans`` and
``checks.first_stage_bytes`` call them): the plans the learner picks for each case,
and the bytes one GPU of the first pipeline stage holds.

A plan passes when it can run, fits, and its predicted step is within ``MARGIN`` of
the fastest plan the planner's search finds: any such plan passes, not one answer.
A rejected plan is explained from the numbers: the part that does not fit and by how
much, or where its time goes next to the best plan's (whose layout is not shown).
Every verdict is on the models' predictions; nothing is timed here.
"""

import functools
import math

from labkit.checks._core import ExerciseFailed, attempt, passed
from labkit.labs.capstone import transformer_costs as cm
from labkit.labs.capstone import plan_costs, planner
from labkit.messages import N_, _

__all__ = ["CASES", "MARGIN", "MEMORY_PLANS", "plans", "first_stage_bytes"]

MARGIN = 0.15   # a plan within 15 % of the best step time passes
GIB = planner.GIB
# The cases to plan (names are the keys of the learner's dict, so not translated):
# Llama 3 shapes, 8192-token sequences, 2 M / 1 M / 4 M tokens per step.
CASES = {case.name: case for case in (
    planner.Case("8B on 4 nodes", cm.LLAMA3["8B"], cm.h100_cluster(4), 8192, 256),
    planner.Case("70B on 4 nodes", cm.LLAMA3["70B"], cm.h100_cluster(4), 8192, 128),
    planner.Case("70B on 32 nodes", cm.LLAMA3["70B"], cm.h100_cluster(32), 8192, 512),
)}
_PART_NAMES = {"compute": N_("compute"), "TP": "TP", "PP": N_("PP (bubble + sends)"),
               "DP": "DP"}   # said as _(...)


def _failed(message: str, key: str) -> ExerciseFailed:
    """The failure, ending with the line that takes the reference instead."""
    if "use_reference" not in message:
        message = message.rstrip() + "\n" + _(
            "Stuck? Go on with labkit's reference solution instead: {line}").format(
                line=f'`checks.use_reference("{key}")`')
    return ExerciseFailed(message)


def _call(key: str, fn, *args):
    try:
        return attempt(key, fn, *args)
    except ExerciseFailed as failure:
        raise _failed(str(failure), key) from None


@functools.cache
def _best(name: str) -> planner.Score:
    return planner.best_plans(CASES[name], top=1)[0]


# ---------------------------------------------------------------- exercise: plans


def _as_plans(chosen, key: str) -> dict:
    """The learner's {case name: Plan}; a dict of Plan's fields is accepted too."""
    names = ", ".join(repr(n) for n in CASES)
    if not isinstance(chosen, dict):
        raise _failed(_("{key}() must return a dict {{case name: planner.Plan(...)}} "
                        "with the keys {names}; got {got!r}.").format(
                            key=key, names=names, got=chosen), key)
    missing = [n for n in CASES if n not in chosen]
    if missing:
        raise _failed(_("{key}(): no plan for {missing}. The keys are {names}.").format(
            key=key, missing=", ".join(repr(n) for n in missing), names=names), key)
    out = {}
    for name in CASES:
        value = chosen[name]
        try:
            out[name] = value if isinstance(value, planner.Plan) else \
                planner.Plan(**value)
        except TypeError as error:
            raise _failed(_("{key}(): the plan for {case!r} must be a planner.Plan, "
                            "e.g. planner.Plan(dp=8, tp=4, pp=1, num_microbatches=4, "
                            "zero_stage=1); got {got!r} ({error}).").format(
                                key=key, case=name, got=value, error=error),
                          key) from None
    return out


def _memory_advice(kind: str, plan: planner.Plan) -> str:
    if kind == "activations":
        return _("Activations shrink with more, smaller micro-batches, with tp (each "
                 "rank keeps 1/tp), and several times over with checkpointing=True "
                 "(for a third more compute).")
    sharded_from = {"optimizer states": 1, "gradients": 2, "parameters": 3}[kind]
    if plan.zero_stage >= sharded_from:
        return _("The plan already shards them over dp = {dp} (zero_stage={zero}): "
                 "split the model further with tp or pp, or use more GPUs in dp."
                 ).format(dp=plan.dp, zero=plan.zero_stage)
    if kind == "optimizer states":
        return _("Adam's states are 12 bytes per parameter: shard them over dp with "
                 "zero_stage >= 1, or split the model with tp or pp.")
    return _("zero_stage=2 shards the gradients and zero_stage=3 the parameters over "
             "dp; tp and pp split both.")


def _not_fitting(name: str, got: planner.Score) -> str:
    mem = got.memory
    kind = mem.largest
    return _("{case}: {plan} does not fit: {total:.1f} GiB on a GPU of stage {stage}, "
             "{over:.1f} GiB over the {usable:.1f} GiB it may use. The largest part "
             "is {kind}: {part:.1f} GiB. {advice}").format(
                 case=name, plan=got.plan, total=mem.total / GIB, stage=mem.stage,
                 over=(mem.total - mem.usable) / GIB, usable=mem.usable / GIB,
                 kind=_(planner.KIND_NAMES[kind]), part=mem.parts[kind] / GIB,
                 advice=_memory_advice(kind, got.plan))


def _time_advice(part: str, plan: planner.Plan, cluster: cm.Cluster) -> str:
    if part == "compute":
        if plan.checkpointing:
            return _("Checkpointing runs every block's forward twice (a third more "
                     "compute): turn it off where the plan fits without it.")
        return _("The slowest stage sets the pace: uneven stages (layers % pp) and "
                 "the output layer on the last stage make one stage slower.")
    if part == "TP":
        if plan.tp > cluster.gpus_per_node:
            return _("tp={tp} spans nodes: its all-reduces cross InfiniBand, about 8x "
                     "slower than NVLink. Keep tp within a node.").format(tp=plan.tp)
        return _("Each block all-reduces its activations 4 times per micro-batch (6 "
                 "with checkpointing) in the TP group. That traffic does not shrink "
                 "with tp while each GPU's compute does: a smaller tp spends less of "
                 "the step on it.")
    if part == "PP":
        return _("The bubble costs (pp - 1)/m of the ideal time: more micro-batches "
                 "(m >= 4 pp) or fewer stages shrink it.")
    return _("The DP traffic is not hidden behind compute: ZeRO-3 all-gathers the "
             "parameters twice per micro-batch (fewer micro-batches or ZeRO-1/2 send "
             "less), and a dp group that spans nodes runs at InfiniBand's speed.")


def _parts(time: planner.StepTime) -> str:
    return ", ".join(f"{_(_PART_NAMES[k])} {v:.2f} s" for k, v in time.parts().items())


def _too_slow(name: str, got: planner.Score, best: planner.Score) -> str:
    mine, theirs = got.time.parts(), best.time.parts()
    worst = max(mine, key=lambda k: mine[k] - theirs[k])
    return _("{case}: {plan} fits, but a step takes {yours:.2f} s, {slower:.0%} more "
             "than the best plan the models find ({best:.2f} s; accepted: within "
             "{margin:.0%}).\n  yours: {mine}\n  best:  {theirs}\n  The largest "
             "difference is {part} (+{extra:.2f} s). {advice}").format(
                 case=name, plan=got.plan, yours=got.time.total,
                 slower=planner.margin_of(got, best), best=best.time.total,
                 margin=MARGIN, mine=_parts(got.time), theirs=_parts(best.time),
                 part=_(_PART_NAMES[worst]), extra=mine[worst] - theirs[worst],
                 advice=_time_advice(worst, got.plan, got.case.cluster))


def _verdict(name: str, plan: planner.Plan) -> tuple[str, str | None]:
    """(the line to print, the reason it is rejected or None)."""
    case = CASES[name]
    problem = planner.plan_problem(case, plan)
    if problem:
        return f"✗ {name}: {plan}", _("{case}: {plan} cannot run: {problem}").format(
            case=name, plan=plan, problem=problem)
    got, best = planner.score(plan, case), _best(name)
    slower = planner.margin_of(got, best)
    line = _("{mark} {case}: {plan}: {seconds:.2f} s per step, {slower:+.0%} vs the "
             "best ({best:.2f} s), {gib:.1f} of {usable:.1f} GiB").format(
                 mark="✓" if got.memory.fits and slower <= MARGIN else "✗",
                 case=name, plan=plan, seconds=got.time.total, slower=slower,
                 best=best.time.total, gib=got.memory.total / GIB,
                 usable=got.memory.usable / GIB)
    if not got.memory.fits:
        return line, _not_fitting(name, got)
    if slower > MARGIN:
        return line, _too_slow(name, got, best)
    return line, None


def plans(choose_plans) -> None:
    """Check ``choose_plans() -> {case name: planner.Plan}`` against the best plan
    the models find for each of ``CASES``; print one line per case."""
    key = "choose_plans"
    chosen = _as_plans(_call(key, choose_plans), key)
    verdicts = [_verdict(name, chosen[name]) for name in CASES]
    for line, _problem in verdicts:
        print(line)
    problems = [problem for _line, problem in verdicts if problem]
    if problems:
        raise _failed("\n\n".join(problems), key)
    passed(key, _("Every plan fits and is within {margin:.0%} of the fastest plan "
                  "the models find (predictions, not measurements).").format(
                      margin=MARGIN))


# ---------------------------------------------------------------- exercise: bytes

_MEMORY_CASE = CASES["70B on 4 nodes"]   # 80 blocks, 32 GPUs, 128 sequences
MEMORY_PLANS = [
    planner.Plan(dp=2, tp=4, pp=4, num_microbatches=8, zero_stage=0),
    planner.Plan(dp=4, tp=2, pp=4, num_microbatches=16, checkpointing=True,
                 zero_stage=1),
    planner.Plan(dp=2, tp=8, pp=2, num_microbatches=2, zero_stage=2),
    planner.Plan(dp=4, tp=4, pp=2, num_microbatches=8, checkpointing=True,
                 zero_stage=3),
    planner.Plan(dp=1, tp=1, pp=32, num_microbatches=32, checkpointing=True),
]   # every ZeRO stage, m above and at pp, checkpointing on and off, uneven stages


def _state_variants(case, plan) -> list[tuple[str, dict]]:
    """Classic mistakes in the training state, each with what it computes."""
    model, tp = case.model, plan.tp
    first = plan_costs.layers_per_stage(model.layers, plan.pp)[0]

    def state(layers, embedding=True, tp_split=True, zero=plan.zero_stage):
        params = layers * model.layer_params + embedding * model.embedding_params
        return plan_costs.state_bytes(params / (tp if tp_split else 1), plan.dp, zero)

    found = [(_("Split every stage's parameters by tp: each TP rank holds 1/tp of "
                "each matrix."), state(first, tp_split=False)),
             (_("The first stage also holds the token embedding "
                "(case.model.embedding_params)."), state(first, embedding=False)),
             (_("A stage holds only its own blocks, "
                "planner.layers_per_stage(layers, pp)[0] of them, not all."),
              state(model.layers)),
             (_("Blocks come whole: the first stage gets ceil(layers / pp) of them."),
              state(model.layers / plan.pp))]
    found += [(_("ZeRO-{stage} shards what stages 1, 2 and 3 add: the optimizer "
                 "states, then the gradients, then the parameters (lab 07). The plan "
                 "asks for zero_stage={zero}.").format(stage=z, zero=plan.zero_stage),
               state(first, zero=z)) for z in range(4) if z != plan.zero_stage]
    return found


def _activation_variants(case, plan, want: float) -> list[tuple[str, float]]:
    model = case.model
    layers = plan_costs.layers_per_stage(model.layers, plan.pp)[0]
    tokens = plan.microbatch_size(case) * case.seq_len
    full = model.activation_bytes_per_token * tokens / plan.tp
    kept = model.checkpoint_bytes_per_token * tokens / plan.tp if \
        plan.checkpointing else full
    held = min(plan.num_microbatches, plan.pp)
    rebuilt = full if plan.checkpointing else 0.0
    return [
        (_("In 1F1B the first stage holds at most pp micro-batches' activations at "
           "once (lab 05's warm-up), not all m."),
         plan.num_microbatches * layers * kept + rebuilt),
        (_("The first stage runs pp forwards before its first backward: it holds "
           "min(m, pp) micro-batches at once, not one."), layers * kept + rebuilt),
        (_("With sequence parallelism each TP rank keeps 1/tp of every activation."),
         want * plan.tp),
        (_("With checkpointing a block keeps only its input "
           "(checkpoint_bytes_per_token per token); the full set is rebuilt for one "
           "block at a time."), held * layers * full),
        (_("Checkpointing keeps every block's input, plus one block's full "
           "activations, rebuilt during its backward."), want - rebuilt),
        (_("A micro-batch is plan.microbatch_size(case) sequences of case.seq_len "
           "tokens."), want * plan.num_microbatches)]


def _hint(case, plan, kind: str, got, want: dict) -> str:
    if kind == "activations":
        variants = _activation_variants(case, plan, want[kind])
    else:
        variants = [(hint, parts[kind]) for hint, parts in _state_variants(case, plan)]
    for hint, value in variants:
        if not math.isclose(value, want[kind], rel_tol=1e-9) and math.isclose(
                got, value, rel_tol=1e-6):
            return hint
    return _("Bytes = values x bytes per value (2, 2, 12; activations as the text "
             "says), / tp, / dp where the ZeRO stage shards that kind.")


def first_stage_bytes(fn) -> None:
    """Check ``fn(case, plan) -> {kind: bytes}`` for a GPU of the first pipeline
    stage (pp >= 2, 1F1B) against the planner's model on several plans."""
    key, case = "first_stage_bytes", _MEMORY_CASE
    if (getattr(fn, "__module__", None) or "").startswith("labkit."):
        raise _failed(_("{key}: that is labkit's own model ({module}.{name}), which "
                        "this exercise asks you to write: define first_stage_bytes "
                        "in the cell above.").format(key=key, module=fn.__module__,
                                                    name=fn.__name__), key)
    for plan in MEMORY_PLANS:
        got = _call(key, fn, case, plan)
        want = plan_costs.first_stage_bytes(case, plan)
        if not isinstance(got, dict) or set(got) != set(want):
            raise _failed(_("{key}: for {plan} return a dict with the keys {keys}, "
                            "got {got!r}.").format(key=key, plan=plan,
                                                   keys=list(want), got=got), key)
        for kind, value in want.items():
            mine = got[kind]
            if isinstance(mine, (int, float)) and math.isclose(mine, value,
                                                               rel_tol=1e-6):
                continue
            shown = f"{mine / GIB:.3f} GiB" if isinstance(mine, (int, float)) \
                else repr(mine)
            raise _failed(_("{key}: {case}, {plan}: {kind} should be {want:.3f} GiB "
                            "({bytes:,.0f} bytes), got {got}. {hint}").format(
                                key=key, case=case.name, plan=plan,
                                kind=_(planner.KIND_NAMES[kind]), want=value / GIB,
                                bytes=value, got=shown,
                                hint=_hint(case, plan, kind, mine, want)
                                if isinstance(mine, (int, float)) else ""), key)
    passed(key, _("The first stage's bytes equal the model's on {count} plans.").format(
        count=len(MEMORY_PLANS)))
