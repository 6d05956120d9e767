"""Lab 03: correct solutions written in other idioms pass their checks.

Each module in tests/alternatives/lab03_*.py is a whole solution of one program
exercise, written the way another source writes it: PyTorch's tutorials (the DDP
tutorial saves ``ddp_model.state_dict()`` with the ``module.`` prefix and imports
``from torch import save, load``), pytorch/examples' DDP series (a snapshot dict),
and a reader of the API docs. The checks judge what a solution computes, so each must
pass, next to test_lab03_ddp.py's mistakes, which must still fail.
"""

import shutil
from pathlib import Path

import pytest
from notebook_cells import write_program

from labkit.labs.ddp import checks

ALTERNATIVES = Path(__file__).resolve().parent / "alternatives"
NOTEBOOK = "03_ddp.ipynb"

CASES = [
    ("lab03_allreduce_tutorial.py", "allreduce_worker.py", checks.allreduce_worker),
    ("lab03_allreduce_flat.py", "allreduce_worker.py", checks.allreduce_worker),
    ("lab03_allreduce_docs.py", "allreduce_worker.py", checks.allreduce_worker),
    ("lab03_ddp_worker_tutorial.py", "ddp_worker.py", checks.ddp_worker),
    ("lab03_ddp_worker_examples.py", "ddp_worker.py", checks.ddp_worker),
    ("lab03_ddp_worker_docs.py", "ddp_worker.py", checks.ddp_worker),
    ("lab03_ddp_script_tutorial.py", "ddp_script.py", checks.ddp_under_torchrun),
    ("lab03_ddp_script_examples.py", "ddp_script.py", checks.ddp_under_torchrun),
    ("lab03_ddp_script_docs.py", "ddp_script.py", checks.ddp_under_torchrun),
]


@pytest.mark.parametrize("alternative, module, check", CASES,
                         ids=[case[0] for case in CASES])
def test_alternative_solution_passes(tmp_path, monkeypatch, capsys, alternative,
                                     module, check):
    """Does a correct solution in another idiom pass the exercise's check?"""
    monkeypatch.chdir(tmp_path)
    write_program(tmp_path, NOTEBOOK, "ddp_worker.py")   # the script imports it
    shutil.copy(ALTERNATIVES / alternative, tmp_path / module)
    check(str(tmp_path / module))
    assert "✅" in capsys.readouterr().out
