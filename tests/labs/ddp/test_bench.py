"""``labkit bench launch`` and ``labkit bench ddp`` at tiny sizes: the headline comes
last, in a loose but real range, so that a broken benchmark cannot pass."""

import re


def _last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def _headline(label: str, unit: str, pairs: int) -> str:
    """The last line's pattern: median, range and pairs, maybe "within the noise"."""
    number = r"\d+(\.\d+)?"
    return (rf"{label}: {number}{unit} \({number}–{number}{unit} over {pairs} pairs"
            r"(; within the noise|; spread wider than the effect)?\)")


def test_launch_costs_about_one_import_of_torch(capsys):
    """Does `bench launch` end with its ratio and range, a launch < 10 imports?"""
    from labkit.labs.ddp.bench_launch_cost import launch_cost

    ratio = launch_cost(pairs=1)
    assert re.fullmatch(_headline("launch vs import torch", "x", 1), _last_line(capsys))
    assert 0 < ratio < 10


def test_ddp_reaches_most_of_the_ceiling(capsys):
    """Does `bench ddp` end with DDP's share of the ceiling, median and range, sane?"""
    from labkit.labs.ddp.bench_ddp_scaling import ddp_scaling

    percent = ddp_scaling(global_batch=128, steps=2, warmup=1, pairs=2)
    assert re.fullmatch(_headline("ddp vs no-communication ceiling", "%", 2),
                        _last_line(capsys))
    assert 20 < percent < 200   # tiny, noisy run: the full one reaches ~90 %
