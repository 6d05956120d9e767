"""What every check shares: calling the learner's code and reporting the verdict."""

import math
import sys
import traceback
from pathlib import Path

from labkit.checks import _reference
from labkit.messages import N_, _

__all__ = ["ExerciseFailed", "attempt", "passed", "expect_close"]


NOT_DONE = N_("not done yet")   # what every "the stub is still there" hint says


class ExerciseFailed(AssertionError):
    """The exercise is not solved yet; the message is the hint.

    Raised inside a check, whatever the failure (the stub, a wrong result, a hang, an
    exception from the learner's code), the message ends with the one line that takes
    labkit's reference instead (``checks.use_reference(...)``), so that the learner can
    go on; and the exercise's earlier pass, if any, is forgotten (``_verdicts``).
    """

    def __init__(self, message: str = ""):
        from labkit.checks import _verdicts
        from labkit.checks._reference import reference_line

        _verdicts.record_failure()
        line = reference_line()
        if line and "use_reference" not in message:
            message = message.rstrip() + "\n" + _(
                "Stuck? Go on with labkit's reference solution instead: {line}"
            ).format(line=line)
        super().__init__(message)
        _reference.record_verdict("failed")   # when the room records (labkit.progress)


def attempt(exercise: str, fn, *args, **kwargs):
    """Call the learner's ``fn``; turn the stub's NotImplementedError, or any other
    exception of the learner's code, into a hint."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise ExerciseFailed(_(
            "{exercise}: not done yet. Replace `raise NotImplementedError()` with your "
            "code and re-run the cell, then this one.").format(exercise=exercise)
        ) from None
    except Exception as err:   # the learner's code raised: say what, and where
        raise ExerciseFailed(_("{exercise}: your code raised {error_type}: {error}")
                             .format(exercise=exercise, error_type=type(err).__name__,
                                     error=err) + _your_lines(err)) from None


def _your_lines(err: BaseException) -> str:
    """The learner's lines in ``err``'s traceback (not labkit's, torch's, Python's)."""
    skip = (str(Path(__file__).resolve().parents[1]), sys.prefix, sys.base_prefix)
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not str(Path(f.filename).resolve()).startswith(skip)]
    where = "\n".join(f"  line {f.lineno}, in {f.name}" + (f": {f.line.strip()}"
                                                            if f.line else "")
                      for f in frames[-2:])
    return _("\nIn your code:\n{where}").format(where=where) if where else ""


def passed(exercise: str, detail: str = "") -> None:
    """Print the success line; record that the exercise passed, and on whose code.

    Passed on labkit's reference, the line says so; in a graded run (``LABKIT_GRADED``)
    the check fails instead, so that the grader gives it no points.
    """
    from labkit.checks import _verdicts

    by = _verdicts.record_pass()
    if by == _verdicts.REFERENCE and _verdicts.graded():
        raise ExerciseFailed(_(
            "{exercise}: this passed on labkit's reference solution "
            "(`checks.use_reference`), not on your code: a graded course gives it no "
            "points. The rest of the lab can go on with it.").format(exercise=exercise))
    print(_("✅ {exercise}: passed. {detail}").format(exercise=exercise,
                                                     detail=detail).rstrip())
    if by == _verdicts.REFERENCE:
        print(_("   (on labkit's REFERENCE solution, not on your code: re-run your own "
                "exercise cell, then this check, to pass on yours.)"))
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
