"""``labkit bench launch`` and ``labkit bench ddp`` at tiny sizes: the headline comes
last, in a loose but real range, so that a broken benchmark cannot pass."""

import re

from bench_headlines import headline, last_line


def test_launch_costs_about_one_import_of_torch(capsys):
    """Does `bench launch` end with its ratio and range, a launch < 10 imports?"""
    from labkit.labs.ddp.bench_launch_cost import launch_cost

    ratio = launch_cost(pairs=1)
    assert re.fullmatch(headline("launch vs import torch", "x", 1), last_line(capsys))
    assert 0 < ratio < 10


def test_ddp_reaches_most_of_the_ceiling(capsys):
    """Does `bench ddp` end with DDP's share of the ceiling, median and range, sane?"""
    from labkit.labs.ddp.bench_ddp_scaling import ddp_scaling

    percent = ddp_scaling(global_batch=128, steps=2, warmup=1, pairs=2)
    assert re.fullmatch(headline("ddp vs no-communication ceiling", "%", 2),
                        last_line(capsys))
    assert 20 < percent < 200   # tiny, noisy run: the full one reaches ~90 %
