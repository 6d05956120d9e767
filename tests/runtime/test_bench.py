"""The benchmarks' shared machinery: the registry (``labkit bench NAME``) and the
paired ratios with their range."""

import subprocess
import sys

import pytest

from labkit import labs


def test_unknown_benchmark_lists_the_valid_ones():
    """Does an unknown benchmark name list the valid ones?"""
    with pytest.raises(ValueError, match="choose one of .*data.*ddp"):
        labs.run_benchmark("nope")


def test_naming_the_benchmarks_does_not_import_torch():
    """Can `labkit bench --help` list the benchmarks without importing torch?"""
    code = ("import sys; import labkit.labs as b; assert 'torch' not in sys.modules; "
            "print(sorted(b.BENCHMARKS))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "'pipeline'" in done.stdout


def test_ratios_report_median_range_and_noise():
    """Is the headline the median with its range, and is noise called noise?"""
    from labkit.bench import Ratios, alternate

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
