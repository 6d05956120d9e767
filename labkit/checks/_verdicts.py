"""Which exercises have passed in this kernel, and on whose code.

Taught in: every lab (what ``checks.solved(...)`` reads; lab 00 introduces it). A
check that passes records its exercise (by the reference key) with what it judged: for
a program exercise the text of the file, for a cell exercise the function object.
"On the reference" means that what passed is labkit's reference as ``use_reference``
or ``solved`` put it in place in this kernel (the file still holds what they wrote, or
the function was compiled from the reference). A check that fails marks the record failed,
so the record is always the last verdict (``checked`` says whether there is one).

``standing(ex, namespace)`` then says whether the exercise *as it is now* passed: a
file edited or a function redefined since its check passed has not. Nothing is
written to disk: a new kernel starts with no record (run the check cells again).

``graded()``: a graded run (``LABKIT_GRADED=1``, set in a graded course's image and
in the grader's environment) gives no points to a check passed on the reference.
"""

import os
from pathlib import Path

from labkit.checks import _reference

__all__ = ["graded", "record_pass", "record_failure", "standing", "checked", "YOURS",
           "REFERENCE"]

YOURS, REFERENCE = "yours", "reference"
# reference key -> {"by": YOURS, REFERENCE or None (failed), "code": what passed}
_PASSED: dict[str, dict] = {}


def graded() -> bool:
    """Whether this is a graded run: $LABKIT_GRADED set to anything but 0/empty."""
    return os.environ.get("LABKIT_GRADED", "").strip().lower() not in ("", "0", "false")


def _judged(ex: dict, frame):
    """What the check in ``frame`` was given first: the learner's function (a cell
    exercise) or the resolved path of their module (a program exercise)."""
    code = frame.f_code
    judged = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
    if ex["kind"] == "file":
        return Path(judged if isinstance(judged, (str, os.PathLike)) else ex["file"]
                    ).resolve()
    return judged


def _running():
    """(exercise, what its check judges) for the check now running, or None."""
    frame, ex = _reference.check_frame(), _reference.running_exercise()
    return (ex, _judged(ex, frame)) if frame is not None and ex is not None else None


def record_pass() -> str | None:
    """Record that the check now running passed; return YOURS or REFERENCE (None
    outside a check of a known exercise)."""
    running = _running()
    if running is None:
        return None
    ex, judged = running
    by = REFERENCE if _reference.is_reference(ex, judged) else YOURS
    code = _reference.digest(judged) if ex["kind"] == "file" else judged
    _PASSED[ex["key"]] = {"by": by, "code": code, "where": judged}
    return by


def record_failure() -> None:
    """Record that the check now running fails (its earlier pass no longer counts)."""
    running = _running()
    if running is not None:
        ex, judged = running
        _PASSED[ex["key"]] = {"by": None, "code": None, "where": judged}


def checked(ex: dict) -> bool:
    """Whether exercise ``ex``'s check ran in this kernel (passed or failed), on the
    file it writes here (a program exercise)."""
    record = _PASSED.get(ex["key"])
    return record is not None and (
        ex["kind"] != "file" or record["where"] == Path(ex["file"]).resolve())


def standing(ex: dict, namespace: dict) -> str | None:
    """YOURS or REFERENCE if exercise ``ex``, as it is now, passed its check; None if
    it has not (never checked, failed, or changed since it passed)."""
    record = _PASSED.get(ex["key"])
    if record is None or record["by"] is None:
        return None
    if ex["kind"] == "file":
        now = _reference.digest(ex["file"])
        return record["by"] if now is not None and now == record["code"] else None
    return record["by"] if namespace.get(ex["key"]) is record["code"] else None
