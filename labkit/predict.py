"""Predictions, recorded before the measurement and shown next to it.

Taught in: every lab's "Predict" cells. A Predict cell is a small code cell in which
the learner writes a guess down (``my_guess = ...``) before running the measurement;
the measurement cell then calls ``reveal`` with that guess, what the theory predicts
and what was measured, so the three stand side by side:

    my_guess = ...   # your guess: the speed-up of 2 ranks over 1
    ...
    labkit.reveal(my_guess, measured=speedup, theory=2.0, what="2 ranks vs 1", unit="x")

A Predict cell that asks about several cases (m = 1, 2, 4, 8; two schedules) takes the
guess in any natural form; ``guesses`` spreads it over the cases:

    my_guess = ...   # your guess, % idle for m = 1, 2, 4, 8: a list, a dict or one number
    mine = labkit.guesses(my_guess, cases=(1, 2, 4, 8))
    for m in (1, 2, 4, 8):
        labkit.reveal(mine[m], measured=..., what=f"m={m}")

A guess left as ``...`` (or None) is reported as not recorded, never as wrong: a
prediction is for learning, not for grading. A guess that was set is always shown,
even when it fits none of the cases (the line then says why). On a static page (the
course book, ``LABKIT_STATIC=1``) nobody could have set one, so the line shows the
theory and the measurement alone.
"""

from labkit.explorers import is_static
from labkit.messages import _

__all__ = ["reveal", "guesses"]


def _is_set(guess) -> bool:
    return guess is not None and guess is not Ellipsis


class _Unfitting:
    """A guess that was set but fits none of the cases: shown with the reason."""

    def __init__(self, guess, reason: str):
        self.guess, self.reason = guess, reason

    def __str__(self) -> str:
        return _("{guess!r} ({reason})").format(guess=self.guess, reason=self.reason)


def _order(cases) -> str:
    return ", ".join(str(case) for case in cases)


def _lookup(guess: dict, case, cases):
    """Find ``case`` in a dict guess: the key itself, or the same text in any case."""
    if case in guess:
        return guess[case]
    for key, value in guess.items():
        if str(key).strip().casefold() == str(case).casefold():
            return value
    return _Unfitting(guess, _("no entry for {case}; the cases are {order}").format(
        case=case, order=_order(cases)))


def guesses(guess, cases) -> dict:
    """Spread one Predict cell's guess over ``cases``, in the order the cell shows them.

    Return ``{case: guess for that case}``. A list or tuple gives one value per case,
    in order; a dict is read by case (``"GPipe"`` finds ``"gpipe"``, ``"8"`` finds
    ``8``); any other value (a number, a word) is the guess for every case. ``...`` or
    None stays "not recorded"; a set guess that fits no case stays set and says why.
    """
    cases = tuple(cases)
    if not _is_set(guess):
        return {case: guess for case in cases}
    if isinstance(guess, dict):
        return {case: _lookup(guess, case, cases) for case in cases}
    if isinstance(guess, (list, tuple)):
        if len(guess) == len(cases):
            return dict(zip(cases, guess))
        wrong = _Unfitting(guess, _(
            "{count} value(s) for {cases} cases: one per case, in the order {order}"
        ).format(count=len(guess), cases=len(cases), order=_order(cases)))
        return {case: wrong for case in cases}
    return {case: guess for case in cases}


def _show(value, unit: str) -> str:
    if isinstance(value, float):
        text = f"{value:.3g}"
    else:
        text = str(value)
    return f"{text}{unit}" if unit in ("x", "%") else f"{text} {unit}".rstrip()


def _your_guess(guess, unit: str) -> str | None:
    """The guess's part of the line; None on a static page, where none was set."""
    if isinstance(guess, _Unfitting):
        return _("your guess {guess}").format(guess=guess)
    if _is_set(guess):
        return _("your guess {guess}").format(guess=_show(guess, unit))
    if is_static():
        return None
    return _("your guess (not recorded: set it in the Predict cell above)")


def _like_measured(guess, measured):
    """A list guess for a dict measurement becomes a dict with the same keys, in order."""
    if not isinstance(measured, dict) or not isinstance(guess, (list, tuple)):
        return guess
    spread = guesses(guess, measured)
    first = next(iter(spread.values()), guess)
    return first if isinstance(first, _Unfitting) else spread


def reveal(guess, measured, theory=None, what: str = "", unit: str = "") -> None:
    """Print the recorded guess next to the theory and the measurement.

    A measurement of several cases is a dict; a list guess is then read in the
    dict's order. It returns nothing, so that as a cell's last line it prints once.
    """
    parts = [_your_guess(_like_measured(guess, measured), unit)]
    if theory is not None:
        parts.append(_("theory {theory}").format(theory=_show(theory, unit)))
    parts.append(_("measured {measured}").format(measured=_show(measured, unit)))
    line = "  |  ".join(part for part in parts if part)
    if what:
        line = _("{what}:").format(what=what) + " " + line
    print(line)
