"""Tests for labkit.predict: a Predict cell's guess, revealed next to the theory and the
measurement, in every natural form, and never reported as unset once it was set."""

import pytest

import labkit
from labkit.explorers import STATIC_ENV

CASES = (1, 2, 4, 8)


@pytest.fixture
def live(monkeypatch):
    """A notebook in JupyterLab (not the static book), whatever the environment."""
    monkeypatch.delenv(STATIC_ENV, raising=False)


def _revealed(capsys, guess, **kwargs) -> str:
    labkit.reveal(guess, **{"measured": 20.0, "what": "bubble", **kwargs})
    return capsys.readouterr().out


def test_reveal_prints_guess_theory_and_measurement(capsys, live):
    """Does a guess print next to the theory and the measurement, on one line?"""
    assert labkit.reveal(1.5, 1.71, theory=2.0, what="2 ranks vs 1", unit="x") is None
    assert capsys.readouterr().out == (
        "2 ranks vs 1: your guess 1.5x  |  theory 2x  |  measured 1.71x\n")


@pytest.mark.parametrize("unset", [..., None])
def test_an_unset_guess_says_so_instead_of_counting_as_wrong(capsys, live, unset):
    """Does a guess left as ... (or None) say where to set it, next to the numbers?"""
    out = _revealed(capsys, unset, theory=25.0, unit="%")
    assert out == ("bubble: your guess (not recorded: set it in the Predict cell "
                   "above)  |  theory 25%  |  measured 20%\n")


def test_a_static_page_shows_the_theory_and_measurement_alone(capsys, monkeypatch):
    """Does the book (LABKIT_STATIC=1), where nobody set a guess, drop that line?"""
    monkeypatch.setenv(STATIC_ENV, "1")
    assert _revealed(capsys, ..., theory=25.0, unit="%") == (
        "bubble: theory 25%  |  measured 20%\n")
    assert _revealed(capsys, ...) == "bubble: measured 20\n"
    assert _revealed(capsys, 30, unit="%") == (
        "bubble: your guess 30%  |  measured 20%\n")   # one that was set still shows


@pytest.mark.parametrize("form, want", [
    (30, {1: 30, 2: 30, 4: 30, 8: 30}),                       # one number for all
    ([50, 33, 20, 11], {1: 50, 2: 33, 4: 20, 8: 11}),         # a list, in order
    ((50, 33, 20, 11), {1: 50, 2: 33, 4: 20, 8: 11}),         # a tuple
    ({1: 50, 2: 33, 4: 20, 8: 11}, {1: 50, 2: 33, 4: 20, 8: 11}),
    ({"1": 50, "2": 33, "4": 20, " 8": 11}, {1: 50, 2: 33, 4: 20, 8: 11}),
])
def test_guesses_reads_every_natural_form(form, want):
    """Are a number, a list or tuple in the order shown, and a dict (keys as numbers
    or as text) all spread over the cases as the learner meant them?"""
    assert labkit.guesses(form, CASES) == want


def test_guesses_finds_a_schedule_by_name_in_any_case():
    """Does {"GPipe": 8, "1F1B": 4} find the cases "gpipe" and "1f1b"?"""
    assert labkit.guesses({"GPipe": 8, "1F1B": 4}, ("gpipe", "1f1b")) == {
        "gpipe": 8, "1f1b": 4}


@pytest.mark.parametrize("form", [30, [30, 30, 30, 30], {1: 30, 2: 30, 4: 30, 8: 30},
                                  {"8": 30, "4": 30, "2": 30, "1": 30}])
def test_a_set_guess_is_never_not_recorded(capsys, live, form):
    """Does every form of a set guess reach each case's line as the learner's value?"""
    mine = labkit.guesses(form, CASES)
    for m in CASES:
        out = _revealed(capsys, mine[m], unit="%")
        assert out == "bubble: your guess 30%  |  measured 20%\n", (form, m, out)


def test_a_guess_that_fits_no_case_is_shown_with_the_reason(capsys, live):
    """Does a list of the wrong length, or a dict without the case, stay recorded and
    say which form the cell wants, instead of "not recorded"?"""
    short = labkit.guesses([50, 33, 20], CASES)
    out = _revealed(capsys, short[8])
    assert "not recorded" not in out
    assert "[50, 33, 20]" in out and "3 value(s) for 4 cases" in out
    assert "in the order 1, 2, 4, 8" in out
    partial = labkit.guesses({1: 50, 2: 33}, CASES)
    assert partial[1] == 50
    out = _revealed(capsys, partial[8])
    assert "not recorded" not in out and "no entry for 8" in out


def test_unset_guesses_stay_unset_for_every_case():
    """Is a guess left as ... still "not recorded" for each case, not a wrong value?"""
    assert labkit.guesses(..., CASES) == {m: ... for m in CASES}


def test_a_list_guess_for_a_dict_measurement_pairs_in_order(capsys, live):
    """Is a list guess shown against a dict measurement key by key, in its order?"""
    labkit.reveal([5, 2], measured={"plain": 8, "no_sync": 2}, what="all-reduces")
    assert capsys.readouterr().out == (
        "all-reduces: your guess {'plain': 5, 'no_sync': 2}  |  measured "
        "{'plain': 8, 'no_sync': 2}\n")
    labkit.reveal([5], measured={"plain": 8, "no_sync": 2}, what="all-reduces")
    out = capsys.readouterr().out
    assert "not recorded" not in out and "1 value(s) for 2 cases" in out
