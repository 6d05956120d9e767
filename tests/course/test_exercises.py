"""Does every lab have enough checked exercises, and does each check fail on the stub
and pass on the solution?

Convention (README, "Writing a lab"): an exercise is a code cell holding
``### BEGIN SOLUTION``; the next code cell is its check (it calls ``checks.``). A
program exercise's cell starts with ``%%writefile NAME.py``.

Where each half is proven, each in a real kernel:
- on the stub: tests/test_reference_switch.py runs every learner notebook; each check
  must fail with ExerciseFailed, "not done yet", ending in its reference line;
- on the solution: the same test then runs the check on the reference (the solved
  cell, from its room's reference.json) and wants its ✅ line; nbval runs every solution
  notebook, where a failing check is a failing cell.
This file holds what needs no kernel: the counts, and that the references are the
solved cells.
"""

from pathlib import Path

import nbformat
import pytest

from coursetools import notebooks
from labkit.checks import _reference

ROOT = Path(__file__).resolve().parents[2]
NAMES = sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))
MIN_EXERCISES, MIN_PROGRAMS = 3, 2
FIRST_PROGRAM_LAB = "02"   # labs 00-01 teach one device: their exercises are functions


@pytest.mark.parametrize("name", NAMES)
def test_each_lab_has_enough_checked_exercises(name):
    """Does each lab have >= 3 checked exercises, >= 2 of them programs from lab 02 on?"""
    found = notebooks.exercises(nbformat.read(ROOT / "solutions" / name, 4), name)
    assert len(found) >= MIN_EXERCISES, (
        f"{name} has {len(found)} checked exercises, want >= {MIN_EXERCISES}")
    programs = [ex for ex in found if ex["kind"] == "file"]
    if name[:2] >= FIRST_PROGRAM_LAB:
        assert len(programs) >= MIN_PROGRAMS, (
            f"{name} has {len(programs)} program exercises (%%writefile), "
            f"want >= {MIN_PROGRAMS}")


@pytest.mark.parametrize("name", NAMES)
def test_every_exercise_has_its_reference(name):
    """Can use_reference find every exercise, with the solved cell as its source?"""
    for ex in notebooks.exercises(nbformat.read(ROOT / "solutions" / name, 4), name):
        stored = _reference.exercise_for(key=ex["key"])
        assert stored is not None, f"{name}: no reference for {ex['key']!r}"
        assert stored["source"] == ex["source"], (
            f"{name}: the reference of {ex['key']!r} is stale: run `labkit build-labs`")
        assert notebooks.BEGIN not in stored["source"]
