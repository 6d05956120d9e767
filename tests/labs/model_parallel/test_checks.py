"""Lab 04's checks: they pass on the notebook's solutions and name each classic
mistake when one is made on purpose (the module written with a change).

Each program test writes the module a %%writefile cell of solutions/04_model_parallel.ipynb
writes into a temporary folder, breaks one line, and runs the check there (2 gloo
ranks). Mistakes that leave a rank waiting use a 3 s bound instead of the lab's 15 s.
"""

import copy
import shutil
from pathlib import Path

import pytest
from notebook_cells import solution_folder, write_program

from labkit import models, timeline
from labkit.checks import ExerciseFailed
from labkit.labs.model_parallel import checks

NOTEBOOK = "04_model_parallel.ipynb"
STUCK_S = 3.0   # how long a check waits for a message that never comes, in tests


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder with the solution's modules; the checks run from it."""
    return solution_folder(tmp_path, monkeypatch, NOTEBOOK,
                           ("split_step.py", "split_serve.py"))


# ---------------------------------------------------------------- exercise 4.1


@pytest.mark.parametrize("answer, hint", [
    (lambda model: model, "return a pair"),
    (lambda model: (copy.deepcopy(model[:3]), copy.deepcopy(model[3:])), "copies"),
    (lambda model: (model[:3], model[3:]), "Linear layers"),
    (lambda model: (model[:5], model[6:]), "keep every layer"),
])
def test_split_in_two_names_the_mistake(answer, hint):
    """Do a non-pair, copied weights, an unbalanced cut and a lost layer get hints?"""
    with pytest.raises(ExerciseFailed, match=hint):
        checks.split_in_two(answer)


# ---------------------------------------------------------------- exercise 4.2


def test_split_step_passes_on_the_solution(folder, capsys):
    """Does the solution's split step give the unsplit model's gradients?"""
    checks.split_step(str(folder / "split_step.py"))
    assert "✅ split_step: passed" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, replace, hint", [
    ("received activations without requires_grad (no input gradient)",
     [("        inputs.requires_grad_()                  # a new leaf: we want its .grad\n",
       "")], r"requires_grad_\(\) on them right after dist.recv"),
    ("the input gradient is never sent back: the first stage hangs",
     [("        dist.send(inputs.grad, dst=ctx.rank - 1)  # the gradient crosses the cut "
       "back\n", "        pass\n")],
     r"Rank 0 waited in its backward .* dist.send\(inputs.grad, dst=ctx.rank - 1\)"),
    ("the activations are never sent",
     [("        dist.send(out.detach(), dst=ctx.rank + 1)   # activations cross the cut\n",
       "        pass\n")], "Rank 1 waited for the activations"),
    ("backward without the received gradient",
     [("        out.backward(grad)                        # continue the chain rule from "
       "there\n", "        out.backward()\n")], r"call out.backward\(grad\)"),
    ("a receive buffer of the wrong shape",
     [("inputs = torch.empty(len(images), width, device=ctx.device)",
       "inputs = torch.empty(len(images), width // 2, device=ctx.device)")],
     r"(?s)\(16, 16\) float32, but rank 0 sent \(16, 32\) float32.*sender.s shape"),
])
def test_split_step_names_the_mistake(folder, mistake, replace, hint):
    """Does each classic mistake of the split step get its own hint, not a hang?"""
    path = write_program(folder, NOTEBOOK, "split_step.py", replace)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.split_step(str(path), bound_s=STUCK_S)


def test_split_step_stub_is_not_done_yet(folder):
    """Does the lab's stub get 'not done yet', naming the file?"""
    path = write_program(folder, NOTEBOOK, "split_step.py", source_folder="labs")
    with pytest.raises(ExerciseFailed, match="not done yet.*split_step.py"):
        checks.split_step(str(path))


# ---------------------------------------------------------------- exercise 4.3


def test_overlap_seconds_hint():
    """Does a wrong overlap get the sweep-line hint?"""
    with pytest.raises(ExerciseFailed, match="Sort the start and end"):
        checks.overlap_seconds(lambda events: 0.0)


# ---------------------------------------------------------------- exercise 4.4


def test_serve_passes_on_the_solution(folder, capsys):
    """Does the solution's serve answer like the unsplit model?"""
    checks.serve(str(folder / "split_serve.py"))
    assert "✅ serve: passed" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, replace, hint", [
    ("the answer never goes back to rank 0",
     [("            dist.send(out, dst=0)                # the answer goes back to rank 0\n",
       "            pass\n")], r"Rank 0 waited for the answer.*dist.send\(out, dst=0\)"),
    ("serving builds an autograd graph",
     [("    with torch.no_grad():                        # no backward: keep no graph\n",
       "    if True:\n")], r"with torch.no_grad\(\)"),
    ("the answer's buffer has the activations' shape",
     [("out = torch.empty(len(request), 10, device=ctx.device)",
       "out = torch.empty(len(request), width, device=ctx.device)")],
     r"the answer is the logits, \(len\(request\), 10\)"),
])
def test_serve_names_the_mistake(folder, mistake, replace, hint):
    """Does each classic serving mistake get its own hint, not a hang?"""
    path = write_program(folder, NOTEBOOK, "split_serve.py", replace)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.serve(str(path), bound_s=STUCK_S)


# ---------------------------------------------------------------- other idioms

ALTERNATIVES = Path(__file__).parent / "alternatives"


@pytest.mark.parametrize("alternative, module, check", [
    ("lab04_split_step_p2pop.py", "split_step.py", checks.split_step),
    ("lab04_split_step_isend.py", "split_step.py", checks.split_step),
    ("lab04_split_serve_inference.py", "split_serve.py", checks.serve),
])
def test_alternative_solution_passes(tmp_path, monkeypatch, capsys, alternative,
                                     module, check):
    """Does a correct solution in another idiom (P2POp + batch_isend_irecv, isend/irecv
    imported by name, inference_mode) pass?"""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ALTERNATIVES / alternative, tmp_path / module)
    check(module)
    assert "passed" in capsys.readouterr().out


# ---------------------------------------------------------------- the lab's measurements


def test_timeline_of_the_solution_never_overlaps(folder):
    """Run 2 recorded steps of the solution: 4 events per rank pair, no overlap?"""
    from labkit import launch, stages
    from labkit.checks._programs import load_program

    load_program(folder / "split_step.py")
    cfg = stages.Config(num_layers=4, width=32, batch=16)
    program = stages.Program("split_step", "train_step", steps=2, warmup=True)
    ranks = launch.run(stages.run_program, 2, args=(program, [cfg]), timeout=60)
    events = ranks[0]["runs"][0]["events"] + ranks[1]["runs"][0]["events"]
    assert sorted((e.row, e.kind, e.microbatch) for e in events) == [
        (rank, kind, step) for rank in (0, 1) for kind in "BF" for step in (0, 1)]
    assert timeline.busy_overlap(events) == 0.0
    grads = {**ranks[0]["runs"][0]["grads"], **ranks[1]["runs"][0]["grads"]}
    assert models.max_difference(stages.reference(cfg)["grads"], grads) < 1e-6


# ---------------------------------------------------------------- on 2 GPUs (NCCL)


@pytest.mark.gpu(2)
def test_split_step_over_nccl_send_recv_gives_the_whole_models_gradients(folder):
    """Lab 04's split step on 2 GPUs: NCCL's real send/recv (no guard, which runs on
    gloo only), the activations and their gradient across the cut: the unsplit
    model's gradients and loss?"""
    from labkit import launch, stages
    from labkit.checks._programs import load_program

    load_program(folder / "split_step.py")
    cfg = stages.Config(num_layers=4, width=512, batch=128)
    program = stages.Program("split_step", "train_step", "batch")
    ranks = launch.run(stages.run_program, 2, args=(program, [cfg]), backend="nccl",
                       timeout=60)
    assert [r["device"] for r in ranks] == ["cuda:0", "cuda:1"]
    want = stages.reference(cfg)
    grads = {**ranks[0]["runs"][0]["grads"], **ranks[1]["runs"][0]["grads"]}
    assert models.max_difference(want["grads"], grads) < 1e-4
    assert ranks[1]["runs"][0]["loss"] == pytest.approx(want["loss"], rel=1e-4)
