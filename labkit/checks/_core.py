"""What every check shares: calling the learner's code and reporting the verdict."""

import math

from labkit.checks import _reference
from labkit.messages import N_, _

__all__ = ["ExerciseFailed", "attempt", "passed", "expect_close"]


NOT_DONE = N_("not done yet")   # what every "the stub is still there" hint says


class ExerciseFailed(AssertionError):
    """The exercise is not solved yet; the message is the hint.

    A "not done yet" message always ends with the one line that takes labkit's
    reference instead (``checks.use_reference(...)``), so a stuck learner can go on.
    """

    def __init__(self, message: str = ""):
        if (NOT_DONE in message or _(NOT_DONE) in message) and "use_reference" not in message:
            from labkit.checks._reference import reference_line

            line = reference_line()
            if line:
                message = message.rstrip() + "\n" + _(
                    "Stuck? Go on with labkit's reference solution instead: {line}"
                ).format(line=line)
        super().__init__(message)
        _reference.record_verdict("failed")   # when the room records (labkit.progress)


def attempt(exercise: str, fn, *args, **kwargs):
    """Call the learner's ``fn``; turn the stub's NotImplementedError into a hint."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise ExerciseFailed(_(
            "{exercise}: not done yet. Replace `raise NotImplementedError()` with your "
            "code and re-run the cell, then this one.").format(exercise=exercise)
        ) from None


def passed(exercise: str, detail: str = "") -> None:
    """Print the success line."""
    print(_("✅ {exercise}: passed. {detail}").format(exercise=exercise,
                                                     detail=detail).rstrip())
    _reference.record_verdict("passed")   # when the room records (labkit.progress)


def expect_close(
    exercise: str, got, want: float, case: str, hint: str = "", rel: float = 1e-6
) -> None:
    """Fail with the numbers and a hint unless ``got`` is within ``rel`` of ``want``."""
    if not isinstance(got, (int, float)) or not math.isclose(
        got, want, rel_tol=rel, abs_tol=1e-12
    ):
        raise ExerciseFailed(_("{exercise}: for {case} expected {want:.6g}, got {got!r}. "
                               "{hint}").format(exercise=exercise, case=case, want=want,
                                                got=got, hint=hint).rstrip())
