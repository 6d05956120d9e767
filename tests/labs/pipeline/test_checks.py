"""Lab 05's checks: they pass on the notebook's solutions and name each classic
mistake when one is made on purpose (the module written with a change).

Each program test writes the module a %%writefile cell of
solutions/05_pipeline_parallel.ipynb writes into a temporary folder, breaks it, and
runs the check there (2 gloo ranks). A deadlock is stopped after 3 s in tests.
"""

import shutil
from pathlib import Path

import pytest
from notebook_cells import solution_folder, write_program

from labkit import launch, models, pipeline, stages
from labkit.checks import ExerciseFailed
from labkit.checks._programs import load_program
from labkit.labs.pipeline import checks

NOTEBOOK = "05_pipeline_parallel.ipynb"
STUCK_S = 3.0   # how long a check waits for a message that never comes, in tests


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder with the solution's modules; the checks run from it."""
    return solution_folder(tmp_path, monkeypatch, NOTEBOOK,
                           ("gpipe.py", "one_f_one_b.py", "pp_torch.py"))


# ---------------------------------------------------------------- exercise 5.1


def test_gpipe_table_shows_the_expected_table():
    """Does a wrong GPipe table get the expected table in the hint?"""
    with pytest.raises(ExerciseFailed, match=r"wrong table for p=2, m=2(.|\n)*F0"):
        checks.gpipe_table(lambda p, m: [[None]])


# ---------------------------------------------------------------- exercise 5.2


def test_gpipe_step_passes_on_the_solution(folder, capsys):
    """Does the solution's GPipe give GPipe's order and the full batch's gradients?"""
    checks.gpipe_step(str(folder / "gpipe.py"))
    assert "✅ gpipe_step: passed" in capsys.readouterr().out


BACKWARD_WAVE = "    for x, out in saved:                          # the backward wave, same order\n"


@pytest.mark.parametrize("mistake, replace, hint", [
    ("loss not divided by m: gradients m times too large",
     [("out = F.cross_entropy(out, y) / m ", "out = F.cross_entropy(out, y) ")],
     "Every gradient is 2 times the full batch's.*Divide each micro-batch's loss by m"),
    ("wrong micro-batch order: the last rank's backward wave reversed",
     [(BACKWARD_WAVE, "    for x, out in (saved[::-1] if last else saved):\n")],
     r"backward waves in different orders \(rank 0: \[0, 1\], rank 1: \[1, 0\]\)"),
    ("received activations without requires_grad",
     [("            x.requires_grad_()\n", "")], r"requires_grad_\(\)"),
    ("no gradient sent back: rank 0 waits",
     [("            dist.send(x.grad, dst=ctx.rank - 1)\n", "            pass\n")],
     "Rank 0 waited in its backward wave"),
])
def test_gpipe_step_names_the_mistake(folder, mistake, replace, hint):
    """Does each classic GPipe mistake get its own hint?"""
    path = write_program(folder, NOTEBOOK, "gpipe.py", replace)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.gpipe_step(str(path), bound_s=STUCK_S)


ONE_AT_A_TIME = '''
import torch
import torch.distributed as dist
import torch.nn.functional as F


def gpipe_step(ctx, stage, microbatches, width):
    first, last = ctx.rank == 0, ctx.rank == ctx.world_size - 1
    m, total = len(microbatches), 0.0
    for x, y in microbatches:          # lab 04's step per micro-batch: no pipeline
        if not first:
            x = torch.empty(len(x), width)
            dist.recv(x, src=ctx.rank - 1)
            x.requires_grad_()
        out = stage(x)
        if last:
            out = F.cross_entropy(out, y) / m
            total += out.item()
            out.backward()
        else:
            dist.send(out.detach(), dst=ctx.rank + 1)
            grad = torch.empty_like(out)
            dist.recv(grad, src=ctx.rank + 1)
            out.backward(grad)
        if not first:
            dist.send(x.grad, dst=ctx.rank - 1)
    return total if last else None
'''


def test_gpipe_step_one_microbatch_at_a_time_is_not_gpipe(folder):
    """Right gradients, but F0 B0 F1 B1: named as not GPipe's fill-drain."""
    path = folder / "gpipe.py"
    path.write_text(ONE_AT_A_TIME)
    with pytest.raises(ExerciseFailed, match="the gradients are right, but rank 0 ran "
                       "F0 B0 F1 B1: that is not GPipe's fill-drain"):
        checks.gpipe_step(str(path), bound_s=STUCK_S)


def test_gpipe_backward_wave_in_another_order_passes(folder, capsys):
    """A backward wave reversed on every rank gives the right gradients: it passes."""
    path = write_program(folder, NOTEBOOK, "gpipe.py",
                         [(BACKWARD_WAVE, "    for x, out in saved[::-1]:\n")])
    checks.gpipe_step(str(path))
    assert "✅ gpipe_step: passed" in capsys.readouterr().out


ALTERNATIVES = Path(__file__).parent / "alternatives"


@pytest.mark.parametrize("alternative, module, check", [
    ("lab05_gpipe_reversed.py", "gpipe.py", checks.gpipe_step),
    ("lab05_gpipe_batched.py", "gpipe.py", checks.gpipe_step),
    ("lab05_one_f_one_b_torch_style.py", "one_f_one_b.py", checks.one_f_one_b),
])
def test_alternative_solution_passes(tmp_path, monkeypatch, capsys, alternative,
                                     module, check):
    """Does a correct solution in another idiom (blocking or not, P2POp batches, tags,
    another micro-batch order, PyTorch's 1F1B grouping) pass?"""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ALTERNATIVES / alternative, tmp_path / module)
    check(module)
    assert "passed" in capsys.readouterr().out


def test_gpipe_table_accepts_tuples_and_dots():
    """Rows as tuples, idle as "." or "": the same table, so it passes."""
    def table(p, m):
        return [tuple("." if a is None else str(a) for a in row)
                for row in pipeline.schedule("gpipe", p, m)]
    checks.gpipe_table(table)


# ---------------------------------------------------------------- exercise 5.3


def test_one_f_one_b_passes_and_measures_memory(folder, capsys):
    """Does the solution's 1F1B pass, holding [2, 1] micro-batches where GPipe holds 4,
    with messages that NCCL would run to the end (no hang named)?"""
    checks.one_f_one_b(str(folder / "one_f_one_b.py"))
    out = capsys.readouterr().out
    assert "✅ one_f_one_b: passed" in out
    assert "holding [2, 1] micro-batches" in out and "GPipe holds [4, 4]" in out
    assert "would hang" not in out


def test_plain_isends_pass_on_gloo_and_are_named_for_nccl(tmp_path, monkeypatch,
                                                          capsys):
    """run_order with one lone dist.isend per send (right on gloo): does it pass, and
    does the check say where NCCL would hang (rank 0 sending a1 as rank 1 sends g0)?"""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ALTERNATIVES / "lab05_one_f_one_b_plain_isend.py",
                tmp_path / "one_f_one_b.py")
    checks.one_f_one_b("one_f_one_b.py")
    out = capsys.readouterr().out
    assert "✅ one_f_one_b: passed" in out
    assert ("On NCCL these messages would hang: rank 0 in a send to rank 1 of (4, 32); "
            "rank 1 in a send to rank 0 of (4, 32)") in out


@pytest.mark.parametrize("mistake, replace, hint", [
    ("warm-up count one too many",
     [("warmup = min(num_stages - rank - 1, m)", "warmup = min(num_stages - rank, m)")],
     "rank 0 of 2 stages, m=4(.|\n)*warm-up .* = 1 forward"),
    ("warm-up not capped at m (m < p)",
     [("warmup = min(num_stages - rank - 1, m)", "warmup = num_stages - rank - 1")],
     r"rank 0 of 4 stages, m=2(.|\n)*min\(p - rank - 1, m\) = 2"),
    ("GPipe's order instead of 1F1B's",
     [("    order += [(\"B\", i) for i in range(m - warmup, m)]",
       "    order = [(\"F\", i) for i in range(m)] + [(\"B\", i) for i in range(m)]\n"
       "    order += []")], "expected(.|\n)*F0 F1 B0 F2 B1 F3 B2 B3"),
    ("blocking sends facing each other: deadlock",
     [("send(out.detach(), ctx.rank + 1, step)",
       "dist.send(out.detach(), dst=ctx.rank + 1)"),
      ("send(x.grad, ctx.rank - 1, step)", "dist.send(x.grad, dst=ctx.rank - 1)")],
     "Two blocking sends facing each other.*not on NCCL.*dist.batch_isend_irecv"),
])
def test_one_f_one_b_names_the_mistake(folder, mistake, replace, hint):
    """Does each classic 1F1B mistake get its own hint, and a deadlock no hang?"""
    path = write_program(folder, NOTEBOOK, "one_f_one_b.py", replace)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.one_f_one_b(str(path), bound_s=STUCK_S)


def test_one_f_one_b_orders_as_strings_or_actions(folder):
    """"F3" strings and pipeline.Action tuples are the same order: accepted."""
    from labkit.labs.pipeline.checks import _normalised

    want = [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert _normalised(["F0", "F1", "B0", "B1"]) == want
    assert _normalised([a for a in pipeline.orders("gpipe", 2, 2)[0]]) == want


def test_one_f_one_b_stub_is_not_done_yet(folder):
    """Does the lab's stub fail with 'not done yet' before anything is launched?"""
    path = write_program(folder, NOTEBOOK, "one_f_one_b.py", source_folder="labs")
    with pytest.raises(ExerciseFailed, match="not done yet"):
        checks.one_f_one_b(str(path))


# ---------------------------------------------------------------- the lab's measurements


def test_gpipe_on_ranks_with_fewer_microbatches_than_stages(folder):
    """Does the solution's GPipe run m=1 on 2 ranks (legal), with the batch's grads?"""
    load_program(folder / "gpipe.py")
    cfg = stages.Config(num_layers=4, width=32, batch=16, num_microbatches=1)
    program = stages.Program("gpipe", "gpipe_step", "microbatches")
    ranks = launch.run(stages.run_program, 2, args=(program, [cfg]), timeout=60)
    grads = {**ranks[0]["runs"][0]["grads"], **ranks[1]["runs"][0]["grads"]}
    assert models.max_difference(stages.reference(cfg)["grads"], grads) < 1e-6
    assert [r["runs"][0]["order"] for r in ranks] == [[("F", 0), ("B", 0)]] * 2


def test_1f1b_holds_less_memory_than_gpipe_on_ranks(folder):
    """With m=8 on 2 ranks, does 1F1B hold 2/8 and 1/8 of GPipe's activation bytes?"""
    module = load_program(folder / "one_f_one_b.py")
    cfg = stages.Config(num_layers=4, width=32, batch=16, num_microbatches=8)
    orders = [[module.one_f_one_b(r, 2, 8) for r in range(2)],
              [[(a.kind, a.microbatch) for a in row] for row in pipeline.orders(
                  "gpipe", 2, 8)]]
    program = stages.Program("one_f_one_b", "run_order", "order")
    ranks = launch.run(stages.run_program, 2, args=(program, [cfg, cfg], orders),
                       timeout=60)
    one_f, gpipe = ([r["runs"][i] for r in ranks] for i in (0, 1))
    assert [r["peak_held"] for r in one_f] == [2, 1]
    assert [r["peak_held"] for r in gpipe] == [8, 8]
    ratios = [f["peak_bytes"] / g["peak_bytes"] for f, g in zip(one_f, gpipe)]
    assert ratios == pytest.approx([2 / 8, 1 / 8])


def test_torch_pipelining_demo_matches_the_full_batch(folder):
    """Do ScheduleGPipe, Schedule1F1B and the tracer give the full batch's gradients,
    and does Schedule1F1B refuse m=1 with PyTorch's ValueError?"""
    module = load_program(folder / "pp_torch.py")
    cfg = stages.Config(num_layers=4, width=32, batch=16, num_microbatches=4)
    ranks = launch.run(module.worker, 2, args=(cfg,), timeout=120)
    want = stages.reference(cfg)
    for key in ("ScheduleGPipe", "Schedule1F1B", "pipeline(...) + ScheduleGPipe"):
        grads = {**ranks[0][key]["grads"], **ranks[1][key]["grads"]}
        assert models.max_difference(want["grads"], grads) < 1e-6, key
        assert ranks[1][key]["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert ranks[0]["1f1b with m=1"] == (
        "ValueError: Number of microbatches (1) must be greater than or equal to the "
        "number of stages (2).")


# ---------------------------------------------------------------- on 2 GPUs (NCCL)


@pytest.mark.gpu(2)
def test_1f1b_runs_on_nccl_with_the_full_batchs_gradients(folder):
    """The lab's run_order on 2 GPUs over NCCL, no guard, micro-batches of 256 KiB:
    does 1F1B finish (each send batched with the next receive: no sends facing each
    other on one stream), with the full batch's gradients and [2, 1] held, and GPipe's
    order through the same loop too?"""
    module = load_program(folder / "one_f_one_b.py")
    cfg = stages.Config(num_layers=8, width=1024, batch=256, num_microbatches=4)
    orders = [[module.one_f_one_b(r, 2, 4) for r in range(2)],
              [[(a.kind, a.microbatch) for a in row] for row in pipeline.orders(
                  "gpipe", 2, 4)]]
    program = stages.Program("one_f_one_b", "run_order", "order")
    ranks = launch.run(stages.run_program, 2, args=(program, [cfg, cfg], orders),
                       backend="nccl", timeout=60)
    assert [r["device"] for r in ranks] == ["cuda:0", "cuda:1"]
    want = stages.reference(cfg)
    for run in (0, 1):
        grads = {**ranks[0]["runs"][run]["grads"], **ranks[1]["runs"][run]["grads"]}
        assert models.max_difference(want["grads"], grads) < 1e-4
        assert ranks[1]["runs"][run]["loss"] == pytest.approx(want["loss"], rel=1e-4)
    assert [r["runs"][0]["peak_held"] for r in ranks] == [2, 1]
