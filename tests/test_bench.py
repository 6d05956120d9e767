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


def test_data_fast_path_beats_the_dataloader(capsys):
    """Does `bench data` end with its ratio, the fast path well ahead (measured ~100x)?"""
    from labkit.bench.data_loading import data_loading

    ratio = data_loading(count=20)
    assert _last_line(capsys) == f"fast path vs DataLoader: {ratio:.1f}x"
    assert 5 < ratio < 10_000


def test_launch_costs_about_one_import_of_torch(capsys):
    """Does `bench launch` end with its ratio, a launch costing < 5 imports of torch?"""
    from labkit.bench.launch_cost import launch_cost

    ratio = launch_cost(repeats=1)
    assert _last_line(capsys) == f"launch vs import torch: {ratio:.2f}x"
    assert 0 < ratio < 5


def test_ddp_reaches_most_of_the_ceiling(capsys):
    """Does `bench ddp` end with DDP's share of the ceiling, in a sane range?"""
    from labkit.bench.ddp_scaling import ddp_scaling

    percent = ddp_scaling(global_batch=128, steps=8, warmup=2, repeats=1)
    assert _last_line(capsys) == f"ddp vs no-communication ceiling: {percent:.0f}%"
    assert 40 < percent < 160   # tiny, noisy run: the full one reaches ~95 %


def test_pipeline_bubble_follows_the_formula(capsys):
    """Does `bench pipeline` end with its worst gap, within 10 points of the formula?"""
    from labkit.bench.pipeline_bubble import bubble_benchmark

    worst = bubble_benchmark(cost_s=0.01, repeats=1)
    last = _last_line(capsys)
    assert last == f"pipeline bubble max deviation: {worst:.1f} points"
    assert re.fullmatch(r"pipeline bubble max deviation: \d+\.\d points", last)
    assert 0 <= worst < 10
