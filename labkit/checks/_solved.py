"""What a later cell builds on: an exercise as its check left it.

Taught in: lab 00 (section "How the exercises work"), then every cell that builds on
an earlier exercise: ``zero1 = checks.solved("zero1_worker.py")``. ``solved(key)``
returns the exercise's module (a program exercise) or function (a cell exercise):

- yours, when its check passed on it as it is now;
- labkit's reference otherwise (never checked in this kernel, failed, or changed since
  it passed), put in place as ``use_reference`` does, and said in one line, with the
  way back. So code that runs but is wrong never breaks the rest of the lab.

In a graded course (references locked) there is no reference to go on with: the cell
fails, saying which exercise must pass first. A check whose exercise builds on an
earlier one (exercise 2.2 imports 2.1's ``parallel_apply``) calls ``prerequisite``.
"""

import sys
from pathlib import Path

from labkit.checks import _verdicts, _reference
from labkit.checks._core import ExerciseFailed
from labkit.checks._programs import load_program
from labkit.messages import _

__all__ = ["solved", "has_passed", "prerequisite"]


def solved(key: str):
    """Return exercise ``key`` (``"zero1_worker.py"``, ``"count_parameters"``): your
    module or function if its check passed on it as it is now, else labkit's
    reference, in place of yours (said in one line)."""
    return _solved(_reference.known_exercise(key), sys._getframe(1).f_globals)


def prerequisite(path):
    """For a check: the module at ``path`` that this exercise builds on. When it is an
    earlier exercise's file here whose check ran in this kernel, as ``solved`` gives it
    (a failed one is replaced by the reference); else the module as it is."""
    ex = _reference.exercise_for(key=Path(path).name)
    if ex is None or ex["kind"] != "file" or not _verdicts.checked(ex) or (
            Path(path).resolve() != Path(ex["file"]).resolve()):
        return load_program(path)
    return _solved(ex, {})


def _solved(ex: dict, namespace: dict):
    by = _verdicts.standing(ex, namespace)
    title, key = ex["title"] or ex["key"], ex["key"]
    if by is None:
        try:
            back = _reference.put_reference(ex, namespace)
        except _reference.NoReference:
            raise ExerciseFailed(_(
                "{title}: its check has not passed yet, and a graded course has no "
                "reference solution to go on with. Make that check pass first, then "
                "run this cell again.").format(title=title)) from None
        print(_("⚠️  {title}: its check has not passed on your `{key}` as it is now, "
                "so the lab goes on with labkit's REFERENCE solution. To use yours, "
                "{back} Run its check, then this cell again.").format(
                    title=title, key=key, back=back))
    elif by == _verdicts.REFERENCE:
        print(_("⚠️  {title}: the lab goes on with labkit's REFERENCE `{key}` (its "
                "check passed on the reference, not on your code).").format(
                    title=title, key=key))
    if ex["kind"] == "file":
        return load_program(ex["file"])
    return namespace[key]


def has_passed(key: str) -> bool:
    """Whether exercise ``key``, as it is now, passed its check (on your code or on
    labkit's reference): a cell that shows what the check measured asks first."""
    ex = _reference.known_exercise(key)
    return _verdicts.standing(ex, sys._getframe(1).f_globals) is not None
