"""``labkit bench pipeline`` at a tiny size: the headline comes last, in a loose but
real range, so that a broken benchmark cannot pass."""

import re

from bench_headlines import last_line


def test_pipeline_bubble_follows_the_formula(capsys):
    """Does `bench pipeline` end with its worst gap, within 10 points of the formula?

    Each action waits a known 50 ms: a loaded machine delays a thread by milliseconds,
    which a 10 ms stage cost turned into a 10-point gap (a red CI once under load)."""
    from labkit.labs.pipeline.bench_pipeline_bubble import bubble_benchmark

    worst = bubble_benchmark(cost_s=0.05, repeats=1)
    last = last_line(capsys)
    assert last == f"pipeline bubble max deviation: {worst:.1f} points"
    assert re.fullmatch(r"pipeline bubble max deviation: \d+\.\d points", last)
    assert 0 <= worst < 10
