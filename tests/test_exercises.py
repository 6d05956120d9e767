"""Does every exercise's check fail on the lab's stub and pass on the solution?

Convention (README, "Writing a lab"): an exercise is a code cell holding
``### BEGIN SOLUTION``; the next code cell is its check (it calls ``checks.``).
A program exercise's cell starts with ``%%writefile NAME.py``, so the notebooks run
in a real Jupyter kernel (nbclient): the setup cell, then every exercise and its
check, in a temporary folder. On the solution each check prints its ✅ line; on the
generated lab each check fails with ExerciseFailed, saying the exercise is not done.
"""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from labkit import course

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))
MIN_EXERCISES, MIN_PROGRAMS = 3, 2
FIRST_PROGRAM_LAB = "02"   # labs 00-01 teach one device: their exercises are functions


def _pairs(name: str, folder: str):
    """Return the setup cell and the (exercise, check) cells, as in ``folder``."""
    code = [c for c in nbformat.read(ROOT / folder / name, as_version=4).cells
            if c.cell_type == "code"]
    solved = [c for c in nbformat.read(ROOT / "solutions" / name, as_version=4).cells
              if c.cell_type == "code"]
    marked = [i for i, c in enumerate(solved) if course.BEGIN in c.source]
    pairs = [(code[i], code[i + 1]) for i in marked]
    for _, check in pairs:
        assert "checks." in check.source, (
            f"{name}: the cell after an exercise must call a check")
    return code[0], pairs


def _run_in_kernel(name: str, folder: str, tmp_path: Path):
    """Run setup + exercise/check pairs in a fresh kernel; return the check cells."""
    setup, pairs = _pairs(name, folder)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.from_dict(setup)] + [
        nbformat.from_dict(cell) for pair in pairs for cell in pair]
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    setup_errors = [o for o in nb.cells[0].outputs if o.output_type == "error"]
    assert not setup_errors, f"{name}: the setup cell failed: {setup_errors}"
    return pairs, nb.cells[2::2]   # the check cells, as executed


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs)


def _errors(cell) -> list:
    return [o for o in cell.outputs if o.output_type == "error"]


@pytest.mark.parametrize("name", NAMES)
def test_checks_pass_on_solution(name, tmp_path):
    """Does each check pass (✅) on the solved exercise, with enough of them per lab?"""
    pairs, checks = _run_in_kernel(name, "solutions", tmp_path)
    assert len(pairs) >= MIN_EXERCISES, (
        f"{name} has {len(pairs)} checked exercises, want >= {MIN_EXERCISES}")
    programs = [ex for ex, _ in pairs if ex.source.startswith("%%writefile")]
    if name[:2] >= FIRST_PROGRAM_LAB:
        assert len(programs) >= MIN_PROGRAMS, (
            f"{name} has {len(programs)} program exercises (%%writefile), "
            f"want >= {MIN_PROGRAMS}")
    for (exercise, check), ran in zip(pairs, checks):
        errors = _errors(ran)
        assert not errors, (f"{name}: check {check.source!r} failed on the solution: "
                            f"{errors[0]['ename']}: {errors[0]['evalue']}")
        assert "✅" in _text(ran), f"{name}: no pass line from {check.source!r}"


@pytest.mark.parametrize("name", NAMES)
def test_checks_fail_on_stub(name, tmp_path):
    """Does each check fail with ExerciseFailed, 'not done yet', on the lab's stub?"""
    pairs, checks = _run_in_kernel(name, "labs", tmp_path)
    for (exercise, check), ran in zip(pairs, checks):
        assert "NotImplementedError" in exercise.source
        errors = _errors(ran)
        assert errors, f"{name}: {check.source!r} passed on the stub"
        assert errors[0]["ename"] == "ExerciseFailed", (
            f"{name}: {check.source!r} raised {errors[0]['ename']}, not ExerciseFailed")
        assert "not done yet" in errors[0]["evalue"], errors[0]["evalue"]
