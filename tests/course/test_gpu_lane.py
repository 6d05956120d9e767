"""The GPU lane goes red whenever a GPU path fails: proven on CPU, with fakes.

Each test runs a notebook the way the lane does (``env/gpu_check.py``'s ``run_one``:
nbval in a fresh kernel, the backend log read back) and looks at its row. The GPU
paths under test are the solutions' own cells, read from the notebooks; what only a
GPU machine would do is faked in a cell before them: a torchrun that fails (lab 03),
an NCCL run that fails (lab 06), NCCL failing to initialise (lab 09), GPUs the lane
sees while the lab chose gloo.
"""

import importlib
import re
from pathlib import Path

import nbformat

import pytest
from course.test_collector import _gpu_check
from notebook_cells import code_cells

from labkit import launch
from labkit.labs.fault_tolerance import watchdog


def _lane_row(folder: Path, sources: list, found: int = 0, world_size: int = 1):
    """Run a notebook of ``sources`` as the lane does, with ``found`` GPUs; its row."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["labkit"] = {"min_gpus": 0, "cpu_ok": True, "world_size": world_size}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    path = folder / "lane.ipynb"
    nbformat.write(nb, path)
    return _gpu_check().run_one(path, found, cell_timeout=300, root=folder)


def _reported(capsys) -> str:
    """What the lane printed about the failure (nbval's traceback), colours removed."""
    return re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().err)


def _cell(notebook: str, marker: str) -> str:
    """The solution's code cell that contains ``marker``."""
    found = [source for source in code_cells(notebook) if marker in source]
    assert len(found) == 1, f"{notebook}: {len(found)} cells hold {marker!r}"
    return found[0]


# ---------------------------------------------------------------- lab 03: torchrun


def test_a_failed_torchrun_in_lab03_turns_the_lane_red(tmp_path, capsys):
    """Lab 03's `!torchrun` cell, with a script whose ranks exit 3: IPython would
    carry on; does the cell stop, so the lane's row is FAIL?"""
    setup = ("import sys, types\nfrom pathlib import Path\n"
             "checks = types.SimpleNamespace(solved=lambda key: None)\n"
             "workdir = Path('work')\nworkdir.mkdir()\n"
             "Path('ddp_script.py').write_text('import sys\\nsys.exit(3)\\n')")
    cell = _cell("03_ddp.ipynb", "!timeout -k 30 300 {torchrun}")
    row = _lane_row(tmp_path, [setup, cell])
    assert row.status == "fail", row
    assert "RuntimeError: torchrun exited with status 1" in _reported(capsys)


# ---------------------------------------------------------------- lab 06: NCCL INFO

FAILED_TORCHRUN = """
import subprocess, torch
torch.cuda.device_count = lambda: 2       # the lane's two GPUs
workdir = "."
subprocess.run = lambda command, **kwargs: subprocess.CompletedProcess(
    command, 1, "", "torch.distributed.DistBackendError: NCCL error: unhandled "
    "system error")                        # torchrun's ranks failed in NCCL
"""


def test_a_failed_nccl_run_in_lab06_turns_the_lane_red(tmp_path, capsys):
    """Lab 06's NCCL INFO cell, its torchrun failing: a FAIL row, not a quiet pass?"""
    cell = _cell("06_communication.ipynb", '"NCCL_DEBUG": "INFO"')
    row = _lane_row(tmp_path, [FAILED_TORCHRUN, cell])
    assert row.status == "fail", row
    assert "RuntimeError: torchrun exited with status 1" in _reported(capsys)


# ---------------------------------------------------------------- lab 09: the abort

FAKE_NCCL = """
import os, subprocess, sys
from pathlib import Path
import torch
from labkit import launch
from labkit.labs.fault_tolerance import watchdog
torch.cuda.device_count = lambda: 2       # the lane's two GPUs
workdir = Path("work")
workdir.mkdir(exist_ok=True)
def mismatch(ctx):
    pass

def fake_run(worker, **kwargs):           # what launch.run raises on the GPU machine
    raise {error}
launch.run = fake_run
"""
NCCL_INIT_FAILED = ('launch.WorkerError("Rank 0 raised torch.distributed.'
                    'DistBackendError: NCCL error: unhandled system error", 0, "")')
WATCHDOG_ABORT = ('launch.LaunchError("Rank 1 exited with code -6 (aborted by the '
                  'backend) before returning a result; the other ranks were stopped.")')


@pytest.mark.parametrize("error, status", [(NCCL_INIT_FAILED, "fail"),
                                           (WATCHDOG_ABORT, "pass")])
def test_lab09_lets_through_every_failure_but_the_watchdogs_abort(tmp_path, capsys,
                                                                  error, status):
    """Lab 09's flight-recorder cell expects NCCL's abort: does NCCL failing to
    initialise (a rank that raised) turn the lane red, and the abort pass?"""
    cell = _cell("09_fault_tolerance.ipynb", "TORCH_FR_DUMP_TEMP_FILE")
    row = _lane_row(tmp_path, [FAKE_NCCL.replace("{error}", error), cell])
    assert row.status == status, row
    if status == "fail":
        assert "WorkerError: Rank 0 raised" in _reported(capsys)


def test_the_watchdogs_abort_is_told_apart(tmp_path):
    """A rank aborted (SIGABRT, as NCCL's watchdog does) or ranks stopped by the
    launcher's timeout end a hang; a rank that raised or was killed does not."""
    (tmp_path / "dying.py").write_text(
        "import os, signal\n"
        "def die(ctx, how):\n"
        "    if ctx.rank == 1:\n"
        "        os.kill(os.getpid(), getattr(signal, how))\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        dying = importlib.import_module("dying")   # the module this test just wrote
        ended = {}
        for how in ("SIGABRT", "SIGKILL"):
            with pytest.raises(launch.LaunchError) as caught:
                launch.run(dying.die, 2, args=(how,), backend="gloo", timeout=30)
            ended[how] = watchdog.ended_a_hang(caught.value)
    finally:
        sys.path.remove(str(tmp_path))
    assert ended == {"SIGABRT": True, "SIGKILL": False}
    assert watchdog.ended_a_hang(launch.CollectiveTimeout("stuck", [1]))
    assert not watchdog.ended_a_hang(launch.WorkerError("raised", 0, ""))
    assert not watchdog.ended_a_hang(launch.DeadlineExceeded("too long", [0, 1]))


# ---------------------------------------------------------------- the backend


@pytest.mark.parametrize("found, status", [(2, "fail"), (0, "pass")])
def test_a_lab_on_gloo_with_a_gpu_per_rank_turns_the_lane_red(tmp_path, found, status):
    """labkit.begin(world_size=2) runs gloo here (no GPU). With 2 GPUs reported by
    the lane (faked), that is a silent fall-back: FAIL, saying so; with none, PASS."""
    row = _lane_row(tmp_path, ["import labkit\nlabkit.begin(world_size=2)"], found,
                    world_size=2)
    assert row.status == status, row
    if status == "fail":
        assert "labkit.begin ran gloo for 2 rank(s) with 2 GPU(s) visible" in row.note


def _choice(where="launch", backend="gloo", asked="auto", world_size=2, gpus=2):
    return {"where": where, "what": "worker", "backend": backend, "asked": asked,
            "world_size": world_size, "gpus": gpus, "device_type": "cpu",
            "devices": "cpu x2"}


def test_backend_problems_count_only_a_choice_labkit_made():
    """A job left to labkit that ran gloo with a GPU per rank is a fall-back; a job
    that asked for gloo (a check), hid its GPUs, or has more ranks than GPUs is not."""
    problems = _gpu_check().backend_problems
    assert problems([_choice()], found=2) == [
        "worker ran gloo for 2 rank(s) with 2 GPU(s) visible: NCCL should have run it"]
    assert problems([_choice(asked="gloo"), _choice(gpus=0), _choice(world_size=4),
                     _choice(backend="nccl")], found=2) == []
