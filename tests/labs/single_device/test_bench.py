"""``labkit bench data`` at a tiny size: the headline comes last, in a loose but
real range, so that a broken benchmark cannot pass."""

import re


def _last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def _headline(label: str, unit: str, pairs: int) -> str:
    """The last line's pattern: median, range and pairs, maybe "within the noise"."""
    number = r"\d+(\.\d+)?"
    return (rf"{label}: {number}{unit} \({number}–{number}{unit} over {pairs} pairs"
            r"(; within the noise|; spread wider than the effect)?\)")


def test_data_fast_path_beats_the_dataloader(capsys):
    """Does `bench data` end with its median ratio and range, the fast path far ahead?

    Measured here at about 100x; under load the DataLoader suffers most, so only a
    gain that no broken benchmark would show is asserted.
    """
    from labkit.labs.single_device.bench_data_loading import data_loading

    ratio = data_loading(seconds=0.2, pairs=3)
    assert re.fullmatch(_headline("fast path vs DataLoader", "x", 3), _last_line(capsys))
    assert 3 < ratio < 10_000
