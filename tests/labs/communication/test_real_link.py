"""Lab 06 on a real shaped link between namespace nodes: the alpha-beta fit recovers
the link's rate, PowerSGD pays few bytes; without root, the emulation alone."""

import pytest

from labkit import cluster
from labkit.labs.communication import bench_allreduce as allreduce_bench
from labkit.labs.communication import real_link

# ---------------------------------------------------------------- lab 06: the link

def test_alpha_beta_fit_recovers_the_shaped_1gbe_rate(can_cluster, capsys):
    """`labkit bench allreduce --link 1gbe`: beta within the stated tolerance?"""
    report = allreduce_bench.allreduce(link="1gbe")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("allreduce on 1gbe: beta ")
    assert f"tolerance ±{allreduce_bench.LINK_TOLERANCE:.0%}" in last
    assert report["shaped_bytes_per_s"] == 125e6
    assert report["within"], last


def test_powersgd_on_the_real_link_and_the_emulation(can_cluster):
    """Both see the link: plain all-reduce pays its bytes at 1 Gbit/s, PowerSGD few."""
    result = real_link.compression_on_link("1gbe", steps=16, limit=2048)
    plain, powersgd = result["rows"]
    assert plain["bytes_per_step"] > 50 * powersgd["bytes_per_step"]
    # Physics, not speed: no step can beat its bytes over the shaped link.
    assert plain["real_ms"] >= 0.9 * plain["wire_ms"]
    assert plain["emulated_ms"] >= plain["wire_ms"]
    assert powersgd["wire_ms"] < 0.1 * plain["wire_ms"]


def test_link_is_an_allreduce_option_only(capsys):
    """`labkit bench ddp --link 1gbe` is refused in one line; allreduce takes it."""
    from labkit import cli, labs

    with pytest.raises(ValueError, match="takes no --link"):
        labs.run_benchmark("ddp", link="1gbe")
    assert cli.main(["bench", "ddp", "--link", "1gbe"]) == 2
    assert "takes no --link" in capsys.readouterr().err
    assert labs.OPTIONS["allreduce"] == ("link",)


def test_compression_on_link_without_root_is_the_emulation_alone(monkeypatch):
    """Where no cluster can run, is the emulation shown alone, with the reason?"""
    monkeypatch.setattr(cluster, "_probe_result", {"reason": "needs root (test)"})
    from labkit import launch
    from labkit.labs.communication import compression

    calls = []
    monkeypatch.setattr(launch, "run", lambda worker, n, args, backend, timeout:
                        calls.append((worker, backend)) or _rows(args[1], backend, n))
    result = real_link.compression_on_link("1gbe", verbose=False)
    assert calls == [(compression.train_variants, "gloo")]
    assert result["reason"] == "needs root (test)" and result["real"] is None


def _rows(specs, backend, n):
    """What train_variants returns on each of ``n`` ranks (bytes and times made up)."""
    return [[{"name": s, "bytes_per_step": 8, "ms_per_step": 1.0, "slow_link_ms": 2.0,
              "backend": backend} for s in specs]] * n


def test_an_nccl_emulation_is_measured_again_on_gloo_for_the_real_link(monkeypatch):
    """As root on a GPU machine, section 3's emulation ran on NCCL: is it run again on
    gloo before the real link's gloo ranks are put next to it (like with like)?"""
    from labkit import launch
    from labkit.labs.communication import compression

    monkeypatch.setattr(cluster, "_probe_result", {"reason": None})
    launched = []

    def run(worker, n, args, backend, timeout):
        launched.append(backend)
        return _rows(args[1], backend, n)

    class Box:   # the two namespace nodes, as far as the comparison goes
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def launch(self, worker, args, timeout):
            launched.append("real link")
            return _rows(args[1], "gloo", 2)

    monkeypatch.setattr(launch, "run", run)
    monkeypatch.setattr(cluster, "Cluster", Box)
    nccl_rows = _rows(["allreduce", "powersgd-1"], "nccl", 1)[0]
    result = real_link.compression_on_link("1gbe", emulated=nccl_rows, verbose=False,
                                           cfg=compression.CompressionConfig())
    assert launched == ["gloo", "real link"]
    assert {r["backend"] for r in result["emulated"]} == {"gloo"}
    gloo_rows = _rows(["allreduce", "powersgd-1"], "gloo", 1)[0]
    launched.clear()
    real_link.compression_on_link("1gbe", emulated=gloo_rows, verbose=False,
                                  cfg=compression.CompressionConfig())
    assert launched == ["real link"]   # already like with like: not run again
