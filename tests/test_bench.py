"""The benchmarks (`labkit bench NAME`), at tiny sizes: the headline comes last, and
the figure is in a loose but real range, so that a broken benchmark cannot pass."""

import re
import subprocess
import sys

import pytest

from labkit import bench


def _last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_unknown_benchmark_lists_the_valid_ones():
    """Does an unknown benchmark name list the valid ones?"""
    with pytest.raises(ValueError, match="choose one of .*data.*ddp"):
        bench.run("nope")


def test_naming_the_benchmarks_does_not_import_torch():
    """Can `labkit bench --help` list the benchmarks without importing torch?"""
    code = ("import sys; import labkit.bench as b; assert 'torch' not in sys.modules; "
            "print(sorted(b.BENCHMARKS))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "'pipeline'" in done.stdout


def _headline(label: str, unit: str, pairs: int) -> str:
    """The last line's pattern: median, range and pairs, maybe "within the noise"."""
    number = r"\d+(\.\d+)?"
    return (rf"{label}: {number}{unit} \({number}–{number}{unit} over {pairs} pairs"
            r"(; within the noise|; spread wider than the effect)?\)")


def test_ratios_report_median_range_and_noise():
    """Is the headline the median with its range, and is noise called noise?"""
    from labkit.bench._pairs import Ratios, alternate

    clear = Ratios((90.0, 100.0, 112.0), null=1.0, digits=0)
    assert clear.headline("fast vs slow") == "fast vs slow: 100x (90–112x over 3 pairs)"
    assert clear.noise_note("the gain") is None
    noisy = Ratios((0.9, 1.2, 1.6), null=1.0, digits=2)   # spread 0.7 > effect 0.2
    assert noisy.headline("a vs b").endswith("over 3 pairs; within the noise)")
    assert "within the noise" in noisy.noise_note("the gain")
    wide = Ratios((1.4, 1.7, 2.5), null=1.0, digits=2)    # all above 1, spread 1.1
    assert wide.headline("a vs b").endswith("pairs; spread wider than the effect)")
    assert "quote the range" in wide.noise_note("the gain")
    calls = []
    alternate(lambda: calls.append("A"), lambda: calls.append("B"), 3)
    assert calls == ["A", "B"] * 3


def test_data_fast_path_beats_the_dataloader(capsys):
    """Does `bench data` end with its median ratio and range, the fast path far ahead?

    Measured here at about 100x; under load the DataLoader suffers most, so only a
    gain that no broken benchmark would show is asserted.
    """
    from labkit.bench.data_loading import data_loading

    ratio = data_loading(seconds=0.2, pairs=3)
    assert re.fullmatch(_headline("fast path vs DataLoader", "x", 3), _last_line(capsys))
    assert 3 < ratio < 10_000


def test_launch_costs_about_one_import_of_torch(capsys):
    """Does `bench launch` end with its ratio and range, a launch < 10 imports?"""
    from labkit.bench.launch_cost import launch_cost

    ratio = launch_cost(pairs=1)
    assert re.fullmatch(_headline("launch vs import torch", "x", 1), _last_line(capsys))
    assert 0 < ratio < 10


def test_ddp_reaches_most_of_the_ceiling(capsys):
    """Does `bench ddp` end with DDP's share of the ceiling, median and range, sane?"""
    from labkit.bench.ddp_scaling import ddp_scaling

    percent = ddp_scaling(global_batch=128, steps=2, warmup=1, pairs=2)
    assert re.fullmatch(_headline("ddp vs no-communication ceiling", "%", 2),
                        _last_line(capsys))
    assert 20 < percent < 200   # tiny, noisy run: the full one reaches ~90 %


def test_pipeline_bubble_follows_the_formula(capsys):
    """Does `bench pipeline` end with its worst gap, within 10 points of the formula?

    Each action waits a known 50 ms: a loaded machine delays a thread by milliseconds,
    which a 10 ms stage cost turned into a 10-point gap (a red CI once under load)."""
    from labkit.bench.pipeline_bubble import bubble_benchmark

    worst = bubble_benchmark(cost_s=0.05, repeats=1)
    last = _last_line(capsys)
    assert last == f"pipeline bubble max deviation: {worst:.1f} points"
    assert re.fullmatch(r"pipeline bubble max deviation: \d+\.\d points", last)
    assert 0 <= worst < 10
