"""Lab 06: correct solutions written in other idioms pass the exercise checks.

Each file in tests/alternatives/lab06_*.py is a whole module a learner could write:
nccl-tests' batched mean and a per-call mean for the timing worker, PyTorch's own
fp16_compress_hook shape and a c10d-imported hook, PyTorch's model-averaging utility
and a flat-vector average for local SGD. Launches: 2 gloo CPU ranks.
"""

import re
import shutil
from pathlib import Path

import pytest
from notebook_cells import write_program

from labkit.labs.communication import checks

ALTERNATIVES = Path(__file__).parent / "alternatives"
CASES = [
    ("lab06_allreduce_timing_batched.py", checks.allreduce_timing, "time_allreduce",
     "a mean over the calls"),
    ("lab06_allreduce_timing_mean.py", checks.allreduce_timing, "time_allreduce",
     "a mean over the calls"),
    ("lab06_cast_hook_docs.py", checks.cast_hook, "cast_hook", ""),
    ("lab06_cast_hook_c10d.py", checks.cast_hook, "cast_hook", ""),
    ("lab06_local_sgd_utils.py", checks.local_sgd_worker, "local_sgd", ""),
    ("lab06_local_sgd_flat.py", checks.local_sgd_worker, "local_sgd", ""),
]


@pytest.mark.parametrize("filename, check, name, said", CASES,
                         ids=[c[0].removesuffix(".py") for c in CASES])
def test_alternative_passes(tmp_path, capsys, filename, check, name, said):
    """Does this other correct idiom pass the check (✅), saying what it returned?"""
    path = tmp_path / filename
    shutil.copy(ALTERNATIVES / filename, path)
    check(str(path))
    out = capsys.readouterr().out
    assert f"✅ {name}" in out and said in out
    assert "Not checked here" in out


def test_the_per_call_mean_of_the_solution_passes(tmp_path, capsys):
    """Is the solution with statistics.mean instead of median accepted, and named?"""
    path = write_program(tmp_path, "06_communication.ipynb", "allreduce_timing.py",
                         [("statistics.median(samples)", "statistics.mean(samples)")])
    checks.allreduce_timing(str(path))
    out = capsys.readouterr().out
    assert re.search(r"✅ time_allreduce.*a mean over the calls", out)


def test_the_solution_is_named_a_median(tmp_path, capsys):
    """Does the solution's per-call median pass, named as the median?"""
    path = write_program(tmp_path, "06_communication.ipynb", "allreduce_timing.py")
    checks.allreduce_timing(str(path))
    assert "a per-call median" in capsys.readouterr().out
