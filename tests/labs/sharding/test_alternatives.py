"""Lab 07: correct solutions written in other idioms pass their checks.

Each module in tests/alternatives/lab07_*.py is a whole solution of one program
exercise, written another way: ZeRO-1 with a reduce-scatter and torch's newer
collective names, with a plain all_reduce, ``narrow`` and an all-gather into a list,
and with PyTorch's own ``ZeroRedundancyOptimizer``; FSDP2 in torchtitan's idiom
(named mesh, ``reshard_after_forward`` per block, step counters counted) and with
finer groups (one per Linear). The checks judge what a solution computes, so each must
pass, next to test_lab07_sharding.py's mistakes, which must still fail.
"""

import shutil
from pathlib import Path

import pytest

from labkit.labs.sharding import checks

ALTERNATIVES = Path(__file__).resolve().parent / "alternatives"

CASES = [
    ("lab07_zero1_reduce_scatter.py", "zero1_worker.py", checks.zero1_worker),
    ("lab07_zero1_gather_list.py", "zero1_worker.py", checks.zero1_worker),
    ("lab07_zero1_zero_redundancy.py", "zero1_worker.py", checks.zero1_worker),
    ("lab07_fsdp_torchtitan.py", "fsdp_worker.py", checks.fsdp_worker),
    ("lab07_fsdp_per_layer.py", "fsdp_worker.py", checks.fsdp_worker),
]


@pytest.mark.parametrize("alternative, module, check", CASES,
                         ids=[case[0] for case in CASES])
def test_alternative_solution_passes(tmp_path, monkeypatch, capsys, alternative,
                                     module, check):
    """Does a correct solution in another idiom pass the exercise's check?"""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ALTERNATIVES / alternative, tmp_path / module)
    check(str(tmp_path / module))
    out = capsys.readouterr().out
    assert "✅" in out
    assert "Not checked here: the CUDA/NCCL branch" in out
