"""Which exercises have passed in this kernel, and on whose code.

Taught in: every lab (what ``checks.solved(...)`` reads; lab 00 introduces it). A
check that passes records its exercise (by the reference key) with what it judged: for
a program exercise the text of the file, for a cell exercise the function object.
"On the reference" means that what passed is labkit's reference as ``use_reference``
or ``solved`` put it in place in this kernel (the file still holds what they wrote, or
the function was compiled from the reference). A check that fails removes the record,
so the record is always the last verdict.

``standing(ex, namespace)`` then says whether the exercise *as it is now* passed: a
file edited or a function redefined since its check passed has not. Nothing is
written to disk: a new kernel starts with no record (run the check cells again).

``graded()``: a graded run (``LABKIT_GRADED=1``, set in a graded course's image and
in the grader's environment) gives no points to a check passed on the reference.
"""

import os
from pathlib import Path

from labkit.checks import _reference

__all__ = ["graded", "record_pass", "record_failure", "standing", "YOURS", "REFERENCE"]

YOURS, REFERENCE = "yours", "reference"
_PASSED: dict[str, dict] = {}   # reference key -> {"by": YOURS|REFERENCE, "code": ...}


def graded() -> bool:
    """Whether this is a graded run: $LABKIT_GRADED set to anything but 0/empty."""
    return os.environ.get("LABKIT_GRADED", "").strip().lower() not in ("", "0", "false")


def _judged(frame):
    """What the check in ``frame`` was given first: the learner's function (cell
    exercises) or the path of their module (program exercises)."""
    code = frame.f_code
    return frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None


def record_pass() -> str | None:
    """Record that the check now running passed; return YOURS or REFERENCE (None
    outside a check of a known exercise)."""
    frame = _reference.check_frame()
    ex = _reference.running_exercise()
    if frame is None or ex is None:
        return None
    judged = _judged(frame)
    if ex["kind"] == "file":
        judged = Path(judged if isinstance(judged, (str, os.PathLike)) else ex["file"])
    by = REFERENCE if _reference.is_reference(ex, judged) else YOURS
    code = _reference.digest(judged) if ex["kind"] == "file" else judged
    _PASSED[ex["key"]] = {"by": by, "code": code}
    return by


def record_failure() -> None:
    """Forget the pass of the exercise whose check is failing now (if any)."""
    ex = _reference.running_exercise()
    if ex is not None:
        _PASSED.pop(ex["key"], None)


def standing(ex: dict, namespace: dict) -> str | None:
    """YOURS or REFERENCE if exercise ``ex``, as it is now, passed its check; None if
    it has not (never checked, failed, or changed since it passed)."""
    record = _PASSED.get(ex["key"])
    if record is None:
        return None
    if ex["kind"] == "file":
        now = _reference.digest(ex["file"])
        return record["by"] if now is not None and now == record["code"] else None
    return record["by"] if namespace.get(ex["key"]) is record["code"] else None
