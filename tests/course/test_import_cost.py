"""env/jupyterhub/import_cost.py: what one process pays, in memory of its own, to
import the course's torch (INSTRUCTORS.md sizes an idle learner from it)."""

import json
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "env" / "jupyterhub" / "import_cost.py"


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=120)


def test_the_steps_add_up_to_the_process_total():
    """Does each step add memory, do they sum to the total, and is the CUDA
    libraries' step there exactly when this torch is a CUDA build?"""
    done = _run("--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    steps = dict(report["steps"])
    total = steps.pop("total")
    assert all(mib >= 0 for mib in steps.values()), steps
    assert abs(sum(steps.values()) - total) < 1.0, report
    assert steps["the rest of import torch"] > 10, steps
    cuda_steps = [name for name in steps if name.startswith("torch's CUDA libraries")]
    assert bool(cuda_steps) == bool(torch.version.cuda), steps
    assert report["torch"] == torch.__version__


def test_the_table_names_the_build_and_what_a_cpu_build_saves():
    done = _run()
    assert done.returncode == 0, done.stderr
    assert f"torch {torch.__version__}" in done.stdout
    if torch.version.cuda and not torch.cuda.is_available():
        assert "torch's CPU build" in done.stdout
        assert "download.pytorch.org/whl/cpu" in done.stdout
