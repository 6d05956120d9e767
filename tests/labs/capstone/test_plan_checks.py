"""Do lab 10's planning checks fail on the stubs, pass on the solution and on other
correct answers, and explain each classic mistake from its numbers?"""

import math
from pathlib import Path

import nbformat
import pytest
from coursetools import build, notebooks

from labkit.checks import ExerciseFailed, _reference
from labkit.labs.capstone import transformer_costs as cm
from labkit.labs.capstone import checks, plan_verdicts, planner

ROOT = Path(__file__).resolve().parents[3]
LAB = ROOT / "solutions" / "10_capstone.ipynb"   # its section 6 plans a real run
Plan = planner.Plan


def _solved(key: str) -> dict:
    """Lab 10's setup cell, section 6's first cell and solved exercise ``key``, run as
    the notebook runs them; returns the namespace."""
    notebook = nbformat.read(LAB, as_version=4)
    setup = "\n".join(c.source for c in notebook.cells
                      if c.get("id") in ("c10-setup", "c10-plan-cases"))
    exercise = next(ex for ex in notebooks.exercises(notebook, LAB.name)
                    if ex["key"] == key)
    namespace: dict = {}
    exec(compile(setup + "\n" + exercise["source"], str(LAB), "exec"), namespace)
    return namespace


def _stub(*args):
    raise NotImplementedError()


def _failure(check, fn) -> str:
    with pytest.raises(ExerciseFailed) as caught:
        check(fn)
    return str(caught.value)


@pytest.mark.parametrize("check, key", [(checks.plans, "choose_plans"),
                                        (checks.first_stage_bytes,
                                         "first_stage_bytes")])
def test_a_check_fails_on_the_stub_with_the_way_on(check, key):
    """Does each check fail on the stub with "not done yet" and the reference line?"""
    message = _failure(check, _stub)
    assert "not done yet" in message
    assert message.endswith(f'`checks.use_reference("{key}")`')


def test_section_6_defines_both_exercises_with_their_checks():
    """Are section 6's exercises the two these checks judge, each checked next?"""
    found = notebooks.exercises(nbformat.read(LAB, as_version=4), LAB.name)
    assert [(ex["key"], ex["check"]) for ex in found][-3:-1] == [
        ("first_stage_bytes", "first_stage_bytes"), ("choose_plans", "plans")]
    assert found[-1]["key"] == "zero1_clip.py"   # the stretch exercise, after them


def test_the_solutions_pass(capsys):
    """Do section 6's solved cells pass both checks?"""
    checks.first_stage_bytes(_solved("first_stage_bytes")["first_stage_bytes"])
    checks.plans(_solved("choose_plans")["choose_plans"])
    out = capsys.readouterr().out
    assert "✅ first_stage_bytes: passed" in out and "✅ choose_plans: passed" in out
    assert out.count("✓ ") == 3


def test_use_reference_puts_the_solution_in_place(monkeypatch, capsys):
    """With lab 10's references in the store (as `labkit build-labs` writes them),
    does use_reference define the solution?"""
    store = build.references(nbformat.read(LAB, as_version=4), LAB.name)
    monkeypatch.setattr(_reference, "_stores", lambda: (__import__("json").loads(
        store),))
    namespace = _solved("choose_plans")   # the setup cell's names: planner, math
    for key in ("choose_plans", "first_stage_bytes"):
        namespace.pop(key, None)
        exec(f"checks.use_reference({key!r})", namespace)
        assert callable(namespace[key])
    checks.plans(namespace["choose_plans"])
    assert "REFERENCE solution" in capsys.readouterr().out


# ---------------------------------------------------------------- choose_plans

GOOD = {"8B on 4 nodes": Plan(dp=32, tp=1, pp=1, num_microbatches=8, zero_stage=3),
        "70B on 4 nodes": Plan(dp=4, tp=8, pp=1, num_microbatches=32, zero_stage=3),
        "70B on 32 nodes": Plan(dp=32, tp=8, pp=1, num_microbatches=8, zero_stage=3)}


def _with(name: str, plan) -> dict:
    return {**GOOD, name: plan}


def test_other_plans_within_the_margin_pass(capsys):
    """Do other correct plans pass: a TP x DP plan 5 % slower, a pipeline, and the
    plan written as a dict of Plan's fields?"""
    other = {"8B on 4 nodes": Plan(dp=16, tp=2, pp=1, num_microbatches=8, zero_stage=3),
             "70B on 4 nodes": dict(dp=2, tp=8, pp=2, num_microbatches=64,
                                    zero_stage=2),
             "70B on 32 nodes": Plan(dp=64, tp=4, pp=1, num_microbatches=8,
                                     zero_stage=3)}
    checks.plans(lambda: other)
    assert "✅ choose_plans: passed" in capsys.readouterr().out


@pytest.mark.parametrize("name, plan, says", [
    ("8B on 4 nodes", Plan(dp=32, tp=1, pp=1, num_microbatches=1, zero_stage=3),
     ["does not fit", "The largest part is activations", "checkpointing=True"]),
    ("70B on 4 nodes", Plan(dp=32, tp=1, pp=1, num_microbatches=4, zero_stage=0),
     ["does not fit", "GiB over the 71.7 GiB", "optimizer states", "zero_stage >= 1"]),
    ("70B on 32 nodes", Plan(dp=256, tp=1, pp=1, num_microbatches=2,
                             checkpointing=True, zero_stage=1),
     ["does not fit", "The largest part is parameters", "zero_stage=3"]),
])
def test_a_plan_that_does_not_fit_is_explained(name, plan, says):
    """Is a plan that does not fit rejected with the part that is too big, by how
    much, and what shrinks it?"""
    message = _failure(checks.plans, lambda: _with(name, plan))
    assert all(s in message for s in says), message
    assert message.endswith('`checks.use_reference("choose_plans")`')


@pytest.mark.parametrize("plan, part, says", [
    (Plan(dp=32, tp=1, pp=1, num_microbatches=8, checkpointing=True, zero_stage=3),
     "compute", "turn it off where the plan fits without it"),
    (Plan(dp=4, tp=2, pp=4, num_microbatches=64, zero_stage=0), "compute",
     "the output layer on the last stage"),
    (Plan(dp=4, tp=8, pp=1, num_microbatches=8, zero_stage=3), "TP",
     "a smaller tp spends less"),
    (Plan(dp=8, tp=2, pp=2, num_microbatches=16, zero_stage=0), "PP (bubble + sends)",
     "more micro-batches"),
])
def test_a_plan_that_is_too_slow_is_explained(plan, part, says):
    """Is a slow plan rejected with its time split next to the best plan's, the part
    that costs the most extra named, and the classic cause of it?"""
    case = checks.CASES["8B on 4 nodes"]
    assert planner.score(plan, case).memory.fits
    message = _failure(checks.plans, lambda: _with("8B on 4 nodes", plan))
    assert "more than the best plan the models find" in message
    assert f"The largest difference is {part} (+" in message, message
    assert says in message, message
    best = planner.best_plans(case, top=1)[0].plan
    assert str(best) not in message   # the best layout is not given away


def test_dp_traffic_that_shows_is_named(monkeypatch):
    """On nodes linked by 10 GbE, is a ZeRO-3 plan with many micro-batches rejected
    for its DP traffic, with the cause named?"""
    slow = cm.Link("10 GbE", 50e-6, 1.25e9, "test")
    case = planner.Case("8B on 4 nodes", cm.LLAMA3["8B"],
                        cm.h100_cluster(4, inter=slow), 8192, 256)
    monkeypatch.setattr(plan_verdicts, "CASES", {case.name: case})
    plan_verdicts._best.cache_clear()
    try:
        message = _failure(checks.plans, lambda: {case.name: Plan(
            dp=32, tp=1, pp=1, num_microbatches=8, zero_stage=3)})
    finally:
        plan_verdicts._best.cache_clear()
    assert "The largest difference is DP (+" in message, message
    assert "ZeRO-3 all-gathers the parameters twice per micro-batch" in message


def test_an_illegal_plan_is_explained():
    """Is a plan that cannot run rejected with its rule, every rejection together?"""
    message = _failure(checks.plans, lambda: {
        **GOOD, "8B on 4 nodes": Plan(dp=8, tp=1, pp=1),
        "70B on 32 nodes": Plan(dp=32, tp=8, pp=1, num_microbatches=8, zero_stage=0)})
    assert "8B on 4 nodes: dp=8 tp=1 pp=1 m=1 ckpt=off zero=1 cannot run: dp x tp x pp"\
        " = 8 GPUs, but the cluster has 32" in message
    assert "70B on 32 nodes" in message   # the second problem is reported too


@pytest.mark.parametrize("returned, says", [
    ([GOOD], "must return a dict"),
    ({"8B on 4 nodes": GOOD["8B on 4 nodes"]}, "no plan for '70B on 4 nodes'"),
    (_with("8B on 4 nodes", (32, 1, 1)), "must be a planner.Plan"),
    (_with("8B on 4 nodes", {"dp": 32, "tensor": 1}), "must be a planner.Plan"),
])
def test_a_malformed_answer_is_explained(returned, says):
    """Is an answer of the wrong shape named, with how to write it?"""
    message = _failure(checks.plans, lambda: returned)
    assert says in message and "use_reference" in message


# ---------------------------------------------------------------- first_stage_bytes


def _correct():
    return _solved("first_stage_bytes")["first_stage_bytes"]


def _other_style(case, plan):
    """A correct answer written another way: the planner's own stage split and a
    loop over the kinds."""
    model = case.model
    layers = planner.layers_per_stage(model.layers, plan.pp)[0]
    per_gpu = (model.embedding_params + layers * model.layer_params) / plan.tp
    widths = {"parameters": (2, 3), "gradients": (2, 2), "optimizer states": (12, 1)}
    out = {kind: per_gpu * width / (plan.dp if plan.zero_stage >= stage else 1)
           for kind, (width, stage) in widths.items()}
    tokens = plan.microbatch_size(case) * case.seq_len / plan.tp
    one = model.activation_bytes_per_token * tokens
    if plan.checkpointing:
        out["activations"] = (min(plan.num_microbatches, plan.pp) * layers
                              * model.checkpoint_bytes_per_token * tokens + one)
    else:
        out["activations"] = min(plan.num_microbatches, plan.pp) * layers * one
    return out


def test_first_stage_bytes_passes_another_correct_style(capsys):
    """Does a correct function in another style pass?"""
    checks.first_stage_bytes(_other_style)
    assert "✅ first_stage_bytes: passed" in capsys.readouterr().out


def _mistake(change):
    """The solution, with ``change(case, plan, right) -> dict`` applied."""
    right = _correct()
    return lambda case, plan: change(case, plan, right(case, plan))


def _scaled(kind, factor):
    return lambda case, plan, got: {**got, kind: got[kind] * factor(case, plan)}


@pytest.mark.parametrize("mistake, hint", [
    (_scaled("activations", lambda c, p: p.num_microbatches / min(
        p.num_microbatches, p.pp)), "at most pp micro-batches"),
    (_scaled("activations", lambda c, p: 1 / min(p.num_microbatches, p.pp)),
     "min(m, pp) micro-batches at once, not one"),
    (_scaled("activations", lambda c, p: p.tp),
     "each TP rank keeps 1/tp of every activation"),
    (_scaled("optimizer states", lambda c, p: p.tp), "Split every stage's parameters"),
    (_scaled("parameters", lambda c, p: 1 / p.dp if p.zero_stage < 3 else 1),
     "ZeRO-"),
    (lambda c, p, got: {**got, "gradients": got["gradients"] * (
        1 if p.zero_stage < 2 else p.dp)}, "ZeRO-"),
])
def test_first_stage_bytes_names_the_classic_mistake(mistake, hint):
    """Does each classic mistake get its hint, and the way on?"""
    message = _failure(checks.first_stage_bytes, _mistake(mistake))
    assert hint in message, message
    assert message.endswith('`checks.use_reference("first_stage_bytes")`')


def test_first_stage_bytes_names_the_embedding_and_checkpointing_mistakes():
    """Are a forgotten embedding and checkpointing ignored each named?"""
    def no_embedding(case, plan):
        got = _correct()(case, plan)
        share = case.model.embedding_params / plan.tp
        sharded = plan.dp if plan.zero_stage >= 3 else 1
        return {**got, "parameters": got["parameters"] - 2 * share / sharded}

    def no_checkpointing(case, plan):
        from dataclasses import replace
        return _correct()(case, replace(plan, checkpointing=False))

    assert "token embedding" in _failure(checks.first_stage_bytes, no_embedding)
    message = _failure(checks.first_stage_bytes, no_checkpointing)
    assert "With checkpointing a block keeps only its input" in message


@pytest.mark.parametrize("returned, says", [
    ({"parameters": 1}, "return a dict with the keys"),
    ("lots", "return a dict with the keys")])
def test_first_stage_bytes_refuses_a_malformed_answer(returned, says):
    """Is a wrong-shaped answer named?"""
    assert says in _failure(checks.first_stage_bytes, lambda case, plan: returned)


def test_first_stage_bytes_reports_a_non_number():
    """Is a value that is not a number shown as it is, without a crash?"""
    def text(case, plan):
        return {**_correct()(case, plan), "activations": "many"}

    message = _failure(checks.first_stage_bytes, text)
    assert "got 'many'" in message and math.isfinite(len(message))


@pytest.mark.parametrize("kind, zero", [("optimizer states", 1), ("optimizer states", 3),
                                        ("gradients", 2), ("parameters", 3)])
def test_memory_advice_never_asks_for_the_zero_stage_the_plan_has(kind, zero):
    """A plan that already shards a kind is not told to shard it: it is told what
    is left (tp, pp, a larger dp)."""
    plan = planner.Plan(dp=4, tp=8, pp=1, num_microbatches=8, zero_stage=zero)
    advice = plan_verdicts._memory_advice(kind, plan)
    assert "already shards them over dp = 4" in advice and "zero_stage >=" not in advice


def test_labkits_own_model_is_not_an_answer():
    """Handing the check the planner's own function is refused, saying why."""
    from labkit.labs.capstone import plan_costs

    with pytest.raises(ExerciseFailed, match="labkit's own model"):
        checks.first_stage_bytes(plan_costs.first_stage_bytes)
