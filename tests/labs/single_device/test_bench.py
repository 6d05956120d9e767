"""``labkit bench data`` at a tiny size: the headline comes last, in a loose but
real range, so that a broken benchmark cannot pass."""

import re

from bench_headlines import headline, last_line


def test_data_fast_path_beats_the_dataloader(capsys):
    """Does `bench data` end with its median ratio and range, the fast path far ahead?

    Measured here at about 100x; under load the DataLoader suffers most, so only a
    gain that no broken benchmark would show is asserted.
    """
    from labkit.labs.single_device.bench_data_loading import data_loading

    ratio = data_loading(seconds=0.2, pairs=3)
    assert re.fullmatch(headline("fast path vs DataLoader", "x", 3), last_line(capsys))
    assert 3 < ratio < 10_000
