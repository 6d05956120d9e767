"""Predictions, recorded before the measurement and shown next to it.

Taught in: every lab's "Predict" cells. A Predict cell is a small code cell in which
the learner writes a guess down (``my_guess = ...``) before running the measurement;
the measurement cell then calls ``reveal`` with that guess, what the theory predicts
and what was measured, so the three stand side by side:

    my_guess = ...   # your guess: the speed-up of 2 ranks over 1
    ...
    labkit.reveal(my_guess, measured=speedup, theory=2.0, what="2 ranks vs 1", unit="x")

A guess left as ``...`` (or None) is reported as not recorded, never as wrong: a
prediction is for learning, not for grading.
"""

from labkit.messages import _

__all__ = ["reveal"]


def _show(value, unit: str) -> str:
    if isinstance(value, float):
        text = f"{value:.3g}"
    else:
        text = str(value)
    return f"{text}{unit}" if unit in ("x", "%") else f"{text} {unit}".rstrip()


def reveal(guess, measured, theory=None, what: str = "", unit: str = "") -> None:
    """Print the recorded guess next to the theory and the measurement.

    It returns nothing, so that as a cell's last line it prints once, not twice.
    """
    recorded = guess not in (None, Ellipsis)
    parts = [_("{what}:").format(what=what) if what else "",
             _("your guess {guess}").format(guess=_show(guess, unit)) if recorded
             else _("your guess (not recorded: set it in the Predict cell above)")]
    if theory is not None:
        parts.append(_("theory {theory}").format(theory=_show(theory, unit)))
    parts.append(_("measured {measured}").format(measured=_show(measured, unit)))
    print(" ".join(parts[:1] + ["  |  ".join(parts[1:])]).strip())
