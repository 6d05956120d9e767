"""Do lab 02's program checks pass the solution and name every classic mistake?

The programs are the solution notebook's ``%%writefile`` cells (parallel_apply.py,
dp_step.py), written to a temporary folder with one deliberate mistake applied
(``notebook_cells.write_program``). Also covers ``labkit.labs.data_parallel.dataparallel``, the plumbing
lab 02 keeps in labkit (replica devices, exact float32, DataParallel memory).
"""

import shutil
from pathlib import Path

import pytest
import torch
from notebook_cells import write_program
from torch import nn

from labkit import models
from labkit.checks import ExerciseFailed
from labkit.labs.data_parallel import checks, dataparallel

NOTEBOOK = "02_data_parallel.ipynb"

# ---------------------------------------------------------------- exercise 2.1

START_THEN_JOIN = (
    "    for thread in threads:\n"
    "        thread.start()                           # all of them running at once"
    "...\n"
    "    for thread in threads:\n"
    "        thread.join()                            # ...then wait for every one\n")
RAISE = 'raise RuntimeError(f"replica {i} raised {type(err).__name__}: {err}") from err'
JOIN_AND_RAISE = (
    "    for thread in threads:\n"
    "        thread.join()                            # ...then wait for every one\n"
    "    for i, err in enumerate(errors):\n"
    "        if err is not None:\n")

PARALLEL_APPLY_MISTAKES = {
    "results in the order threads finish": (
        [("results, errors = [None] * len(fns), [None] * len(fns)",
          "results, errors = [], [None] * len(fns)"),
         ("results[i] = fns[i](*args[i])", "results.append(fns[i](*args[i]))")],
        "order the threads finished"),
    "exception kept but never raised": (
        [("errors[i] = err", "pass")], "swallowed"),
    "exception not caught in the thread": (
        [("except Exception as err:", "except ZeroDivisionError as err:")],
        "The thread died with ValueError"),
    "replica not named": ([(RAISE, "raise err")], "which replica failed"),
    "replica's error lost": (
        [(RAISE, 'raise RuntimeError(f"replica {i} failed") from None')],
        "own error is lost"),
    "raised before the other threads ended": (
        [(JOIN_AND_RAISE, "    for i, thread in enumerate(threads):\n"
                          "        thread.join()\n"
                          "        err = errors[i]\n"
                          "        if err is not None:\n")],
        "raised before replica\\(s\\) \\[2\\] finished"),
    "start, join, start, join": (
        [(START_THEN_JOIN, "    for thread in threads:\n"
                           "        thread.start()\n"
                           "        thread.join()\n")],
        "one after the other, in threads, but each started after"),
    "no threads at all": (
        [("threads = [threading.Thread(target=run, args=(i,)) "
          "for i in range(len(fns))]",
          "threads = []\n    for i in range(len(fns)):\n        run(i)")],
        "all in the calling thread"),
    "no join": (
        [("    for thread in threads:\n        thread.join()                  "
          "          # ...then wait for every one\n", "")],
        "returned before replica"),
    "grad mode not carried into the threads": (
        [("with torch.set_grad_enabled(grad_enabled):", "with torch.enable_grad():")],
        "Grad mode is per thread"),
}


def test_parallel_apply_passes_on_the_solution(tmp_path, capsys):
    """Does the solution's parallel_apply pass, with its pass line?"""
    checks.parallel_apply(write_program(tmp_path, NOTEBOOK, "parallel_apply.py"))
    assert "✅ parallel_apply: passed" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", sorted(PARALLEL_APPLY_MISTAKES))
def test_parallel_apply_names_the_mistake(tmp_path, mistake):
    """Does the parallel_apply check name each classic mistake?"""
    replace, hint = PARALLEL_APPLY_MISTAKES[mistake]
    path = write_program(tmp_path, NOTEBOOK, "parallel_apply.py", replace)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.parallel_apply(path)


QUEUE_PER_REPLICA = """
import queue
import threading


def parallel_apply(fns, args):
    done = queue.Queue()

    def run(i):
        done.put((i, fns[i](*args[i])))   # a replica that raises never puts

    for i in range(len(fns)):
        threading.Thread(target=run, args=(i,)).start()
    results = dict(done.get() for _ in fns)
    return [results[i] for i in range(len(fns))]
"""


def test_parallel_apply_that_waits_forever_is_stopped(tmp_path):
    """Does a parallel_apply that waits for a dead replica fail, not hang?"""
    path = tmp_path / "parallel_apply.py"
    path.write_text(QUEUE_PER_REPLICA)
    with pytest.raises(ExerciseFailed, match="did not return within 2 s"):
        checks.parallel_apply(path, timeout=2)


def test_parallel_apply_stub_is_not_done_yet(tmp_path):
    """Is the lab's untouched parallel_apply 'not done yet'?"""
    path = write_program(tmp_path, NOTEBOOK, "parallel_apply.py", source_folder="labs")
    with pytest.raises(ExerciseFailed, match="not done yet"):
        checks.parallel_apply(path)


def test_missing_module_says_run_the_cell(tmp_path):
    """Does a check before its %%writefile cell ran say to run that cell?"""
    with pytest.raises(ExerciseFailed, match="does not exist yet"):
        checks.parallel_apply(tmp_path / "parallel_apply.py")


# ---------------------------------------------------------------- exercise 2.2

STEP = ("    optimizer.step()                              "
        "# 5. one update of the one model\n")

DP_STEP_MISTAKES = {
    "plain mean instead of the weighted one": (
        [("n / total * c.grad", "1 / len(sizes) * c.grad")],
        "plain mean of the replicas"),
    "equal weights passed by the step": (
        [("reduce_gradients(model, replicas, sizes)      #",
          "reduce_gradients(model, replicas, [1] * len(sizes))  #")],
        "at step 1 .* differs .* plain mean of the replicas"),
    "gradients summed": ([("n / total * c.grad", "c.grad")], "the sum of the replicas"),
    "weighted by n_r, not divided by N": (
        [("n / total * c.grad", "n * c.grad")], "not divided by N"),
    "stale replicas (made once, reused)": (
        [("replicas = replicate(model, devices)",
          "replicas = globals().setdefault('_made', replicate(model, devices))")],
        "at step 2 .* stale"),
    "a replica's optimizer stepped": (
        [(STEP, "    type(optimizer)(replicas[0].parameters(), lr=0.1).step()\n")],
        "(?i)an optimizer over other parameters than the model's"),
    "a new optimizer over the model": (
        [(STEP, "    type(optimizer)(model.parameters(), lr=0.1).step()\n")],
        "at step 2 .* the gradient was right but the weights .* (?i:you stepped a new "
        "optimizer)"),
    "one step per replica": (
        [(STEP, "    for _ in replicas:\n        optimizer.step()\n")],
        "stepped 2 times"),
    "zero_grad forgotten": (
        [("    optimizer.zero_grad(set_to_none=True)\n", "")],
        "at step 2 .* accumulated"),
    "replicas run in the calling thread": (
        [("parallel_apply([forward_backward] * len(jobs), jobs)",
          "[forward_backward(*job) for job in jobs]")],
        "one after the other in the calling"),
    "the model itself as replica 0": (
        [("return [copy.deepcopy(model).to(device) for device in devices]",
          "return [model] + [copy.deepcopy(model).to(d) for d in devices[1:]]")],
        "is the model itself"),
    "shallow copies": ([("copy.deepcopy(model)", "copy.copy(model)")], "shallow copy"),
    "unbalanced chunks": (
        [("images.tensor_split(len(devices)), labels.tensor_split(len(devices))",
          "images.tensor_split([1, 2]), labels.tensor_split([1, 2])")],
        "got \\[1, 1, 8\\]"),
    "every chunk on devices[0]": (
        [("for (x, y), device in zip(pieces, devices)]",
          "for (x, y), device in zip(pieces, [devices[0]] * len(devices))]")],
        "chunk 1 is on \\['cpu'\\], not on meta"),
    "replicas left on the model's device": (
        [("copy.deepcopy(model).to(device) for device in devices",
          "copy.deepcopy(model) for device in devices")],
        "replica 1 is on \\['cpu'\\], not on meta"),
    "labels split apart from images": (
        [("labels.tensor_split(len(devices))",
          "labels.flip(0).tensor_split(len(devices))")],
        "do not match"),
    "no backward": (
        [("    loss.backward()                      # the gradients land in the "
          "replica's .grad\n", "")], "call loss.backward"),
    "summed loss per replica": (
        [("F.cross_entropy(replica(images), labels)",
          "F.cross_entropy(replica(images), labels, reduction='sum')")], "SUMMED loss"),
    "plain mean of the losses returned": (
        [("return sum(n / sum(sizes) * loss.item() for n, loss in zip(sizes, losses))",
          "return sum(loss.item() for loss in losses) / len(losses)")],
        "plain mean of the replicas' losses"),
}


def _dp_program(folder, replace=(), source_folder="solutions"):
    write_program(folder, NOTEBOOK, "parallel_apply.py")
    return write_program(folder, NOTEBOOK, "dp_step.py", replace, source_folder)


def test_dp_step_passes_on_the_solution(tmp_path, capsys):
    """Does the solution's step pass: 127 images over 2 and 3 replicas, 3 steps?"""
    checks.data_parallel_step(_dp_program(tmp_path), tmp_path / "parallel_apply.py")
    out = capsys.readouterr().out
    assert "✅ data_parallel_step: passed" in out and "43+42+42" in out


@pytest.mark.parametrize("mistake", sorted(DP_STEP_MISTAKES))
def test_dp_step_names_the_mistake(tmp_path, mistake):
    """Does the data-parallel step check name each classic mistake?"""
    replace, hint = DP_STEP_MISTAKES[mistake]
    path = _dp_program(tmp_path, replace)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.data_parallel_step(path, tmp_path / "parallel_apply.py")


def test_dp_step_stub_is_not_done_yet(tmp_path):
    """Is the lab's untouched step 'not done yet', even with parallel_apply solved?"""
    path = _dp_program(tmp_path, source_folder="labs")
    with pytest.raises(ExerciseFailed, match="not done yet"):
        checks.data_parallel_step(path, tmp_path / "parallel_apply.py")


def test_dp_step_shows_the_learners_line(tmp_path):
    """Does a crash in the learner's step show the exception and their line?"""
    path = _dp_program(tmp_path, [("sizes = [len(y) for _, y in chunks]",
                                   "sizes = [len(y) for _, y in chunk]")])
    with pytest.raises(ExerciseFailed, match="NameError(.|\n)*In your code"):
        checks.data_parallel_step(path, tmp_path / "parallel_apply.py")


def test_dp_step_renamed_function_is_named(tmp_path):
    """Does a module without one of the five functions get a clear message?"""
    path = _dp_program(tmp_path, [("def forward_backward(", "def fwd_bwd(")])
    with pytest.raises(ExerciseFailed, match="has no function forward_backward"):
        checks.data_parallel_step(path, tmp_path / "parallel_apply.py")


def test_checks_leave_no_hooks_behind(tmp_path):
    """Are the spies (global forward and optimizer hooks) removed after a check?"""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module

    before = (len(nn_module._global_forward_pre_hooks),
              len(optim_module._global_optimizer_pre_hooks))
    stale, _ = DP_STEP_MISTAKES["stale replicas (made once, reused)"]
    path = _dp_program(tmp_path, stale)
    with pytest.raises(ExerciseFailed):
        checks.data_parallel_step(path, tmp_path / "parallel_apply.py")
    assert (len(nn_module._global_forward_pre_hooks),
            len(optim_module._global_optimizer_pre_hooks)) == before


# ---------------------------------------------------------------- other idioms

ALTERNATIVES = Path(__file__).resolve().parent / "alternatives"


def _alternative(folder, stem, module):
    """Copy tests/alternatives/<stem>.py into ``folder`` as the module a cell writes."""
    path = Path(folder) / module
    shutil.copy(ALTERNATIVES / f"{stem}.py", path)
    return path


@pytest.mark.parametrize("stem", ["lab02_parallel_apply_futures",
                                  "lab02_parallel_apply_pytorch",
                                  "lab02_parallel_apply_notes"])
def test_parallel_apply_passes_in_other_idioms(tmp_path, capsys, stem):
    """Does a correct parallel_apply in another idiom pass (futures, PyTorch's own
    ExceptionWrapper, exception notes; "Replica 1 failed" in any case)?"""
    checks.parallel_apply(_alternative(tmp_path, stem, "parallel_apply.py"))
    assert "✅ parallel_apply: passed" in capsys.readouterr().out


@pytest.mark.parametrize("message", ["Replica 1 failed", "REPLICA #1 FAILED",
                                     "fns[1] raised", "replica index 1 raised"])
def test_parallel_apply_accepts_any_naming_of_the_replica(tmp_path, capsys, message):
    """Is the failing replica accepted however the message spells it?"""
    path = write_program(tmp_path, NOTEBOOK, "parallel_apply.py",
                         [(RAISE, f"raise RuntimeError({message!r}) from err")])
    checks.parallel_apply(path)
    assert "✅ parallel_apply: passed" in capsys.readouterr().out


@pytest.mark.parametrize("stem, sizes", [("lab02_dp_step_chunk", "43+43+41"),
                                         ("lab02_dp_step_tutorial", "43+42+42")])
def test_dp_step_passes_in_other_idioms(tmp_path, capsys, stem, sizes):
    """Does a correct step in another idiom pass: chunk's sizes as nn.DataParallel
    splits (43/43/41), or a tutorial's state_dict replicas and torch.stack?"""
    helper = write_program(tmp_path, NOTEBOOK, "parallel_apply.py")
    checks.data_parallel_step(_alternative(tmp_path, stem, "dp_step.py"), helper)
    out = capsys.readouterr().out
    assert "✅ data_parallel_step: passed" in out and sizes in out
    assert "Not checked here: that reduce_gradients" in out or torch.cuda.is_available()


def test_dp_step_runs_on_other_parallel_apply(tmp_path, capsys):
    """Does the solution's step pass on top of another correct parallel_apply?"""
    helper = _alternative(tmp_path, "lab02_parallel_apply_futures", "parallel_apply.py")
    checks.data_parallel_step(write_program(tmp_path, NOTEBOOK, "dp_step.py"), helper)
    assert "✅ data_parallel_step: passed" in capsys.readouterr().out


# ---------------------------------------------------------------- dataparallel (the room)


def test_replica_devices_says_why(capsys):
    """Does replica_devices print its choice (CPU copies when GPUs are too few)?"""
    devices = dataparallel.replica_devices(torch.cuda.device_count() + 1)
    assert all(d.type == "cpu" for d in devices)
    assert "copies on the CPU" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_replica_devices_refuses_bad_counts(bad):
    """Is a non-positive or fractional replica count refused?"""
    with pytest.raises(ValueError, match="positive integer"):
        dataparallel.replica_devices(bad)


def test_exact_float32_restores_the_flags():
    """Does exact_float32 switch TF32 off inside and restore the flags after?"""
    before = dataparallel.float32_precisions()
    with dataparallel.exact_float32():
        inside = dataparallel.float32_precisions()
        assert set(inside.values()) <= {"ieee", False}, inside
    assert dataparallel.float32_precisions() == before
    if hasattr(torch.backends.cudnn, "conv"):   # torch >= 2.9: the current API
        assert set(inside) == {"matmul", "conv", "rnn"}


def test_dataparallel_memory_without_two_gpus(capsys):
    """Does the GPU-0 memory measurement return None and say why without 2 GPUs?"""
    if torch.cuda.device_count() >= 2:
        pytest.skip("2+ GPUs: the measurement runs for real (see the GPU test)")
    assert dataparallel.dataparallel_memory(nn.Linear(2, 2)) is None
    assert "nothing to spread" in capsys.readouterr().out


@pytest.mark.gpu(2)
def test_dataparallel_memory_gpu0_carries_more():
    """Does GPU 0 peak above the other GPUs in a DataParallel step?"""
    peaks = dataparallel.dataparallel_memory(models.deep_mlp(8, 2048), batch=4096)
    assert peaks[0] > max(peaks[1:])


@pytest.mark.parametrize("gpus, want", [(0, "cpu"), (1, "cuda:0"), (2, "cuda:0")])
def test_module_device_is_cuda0_whenever_there_are_gpus(monkeypatch, gpus, want):
    """Is DataParallel's module put on cuda:0 with 1-2 GPUs too (where the lab's 3
    replicas stay on the CPU), and on the CPU without GPUs?"""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert dataparallel.module_device() == torch.device(want)
    replicas = dataparallel.replica_devices(3, verbose=False)
    assert all(d.type == "cpu" for d in replicas)   # 3 replicas need 3 GPUs


def test_notebook_wraps_the_module_on_module_device():
    """Does the lab build nn.DataParallel on module_device(), not on the replicas'
    device (a CPU module crashes DataParallel's forward on 1-2 GPUs)?"""
    from notebook_cells import code_cells

    for folder in ("solutions", "labs"):
        cell = next(c for c in code_cells(NOTEBOOK, folder) if "nn.DataParallel(" in c)
        assert "dataparallel.module_device()" in cell and "devices[0]" not in cell
        assert ".to(dp_device)" in cell.split("nn.DataParallel(")[1].split("\n")[0]
