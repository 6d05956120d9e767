"""Lab 06 (communication): the alpha-beta model, the hooks, local SGD, the profiler
and straggler workers, the two benches, and a hint for every classic mistake of the
three program exercises.

Launches use 2 gloo CPU ranks with one thread each. Stated tolerances: a compressed
hook's gradients are within ``HOOK_TOLERANCE`` (fp16 2e-3, bf16 1e-2) of plain DDP's,
relative to each tensor's largest gradient; PowerSGD (rank 2, 10 warm-up steps)
reaches at least 85 % MNIST test accuracy in 200 steps, within 3 points of plain DDP.
"""

import importlib
import json
import re
import textwrap

import pytest
from notebook_cells import write_program

from labkit import data, launch, models
from labkit.labs import BENCHMARKS
from labkit.checks import ExerciseFailed
from labkit.labs.communication import (
    bottleneck,
    checks,
    comm_model,
    compression,
    local_sgd,
)

NOTEBOOK = "06_communication.ipynb"


def _run(worker, *args):
    return launch.run(worker, world_size=2, args=args, backend="gloo", timeout=120)


# ---------------------------------------------------------------- the model


def test_fit_recovers_alpha_and_beta():
    """Does the fit give back the alpha and beta that generated the times?"""
    sizes = [4**k for k in range(1, 13)]
    times = {n: 250e-6 + n / 1.5e9 for n in sizes}
    fit = comm_model.fit_alpha_beta(times)
    assert fit.alpha == pytest.approx(250e-6, rel=1e-6)
    assert fit.beta == pytest.approx(1.5e9, rel=1e-6)
    assert fit.seconds(2**20) == pytest.approx(times[2**20], rel=1e-6)
    assert fit.half_bytes == pytest.approx(250e-6 * 1.5e9)


def test_fit_weights_small_messages_like_large_ones():
    """Does 10 % noise on one big message leave alpha (set by small ones) intact?"""
    sizes = [4**k for k in range(1, 13)]
    times = {n: 300e-6 + n / 1e9 for n in sizes}
    times[sizes[-1]] *= 1.1
    assert comm_model.fit_alpha_beta(times).alpha == pytest.approx(300e-6, rel=0.05)


@pytest.mark.parametrize("times", [{4: 1e-4}, {4: 1e-4, 16: 0.0}, {}])
def test_fit_refuses_too_little(times):
    """Are fewer than 2 sizes, or a zero time, refused with the numbers?"""
    with pytest.raises(ValueError, match="at least 2 sizes"):
        comm_model.fit_alpha_beta(times)


def test_bus_factor_and_table(capsys):
    """Is busbw algbw x 2(n-1)/n, as nccl-tests prints it?"""
    assert comm_model.bus_factor(1) == 0 and comm_model.bus_factor(2) == 1.0
    assert comm_model.bus_factor(8) == 1.75
    with pytest.raises(ValueError, match="positive integer"):
        comm_model.bus_factor(0)
    rows = comm_model.table({1000: 1e-6, 4000: 2e-6}, world_size=4)
    assert rows[1]["algbw"] == pytest.approx(2.0)
    assert rows[1]["busbw"] == pytest.approx(3.0)
    assert "busbw GB/s" in capsys.readouterr().out


def test_ring_and_step_predictions():
    """Do the ring time and the step prediction follow the formulas of the lab?"""
    assert comm_model.ring_seconds(1e9, 1, 10.0) == 0.0
    assert comm_model.ring_seconds(1e9, 4, 10.0, alpha=1e-3, messages=2) == (
        pytest.approx(2e-3 + 1.5 * 0.1))
    with pytest.raises(ValueError, match="positive"):
        comm_model.ring_seconds(1, 2, 0.0)
    step = comm_model.ddp_step(0.1, 0.05, world_size=4)
    assert step["speedup"] == pytest.approx(4 * 0.1 / 0.15)
    assert comm_model.ddp_step(0.1, 0.05, 4, overlap=1.0)["efficiency"] == 1.0
    with pytest.raises(ValueError, match="share between 0 and 1"):
        comm_model.ddp_step(0.1, 0.05, 4, overlap=1.5)


def test_memcpy_is_measured():
    """Does the memory-copy probe return a bandwidth (GB/s) no machine exceeds?
    (No lower bound: at load 11 on 2 cores a 4 MiB copy measured 0.097 GB/s.)"""
    assert 0 < comm_model.memcpy_gbytes_per_s(2**22, repeats=2) < 1000


# ---------------------------------------------------------------- hooks and compression


def test_builtin_hooks_average_within_the_stated_tolerance(tmp_path, capsys):
    """Do fp16_compress_hook and bf16_compress_hook pass the hook check (2 ranks,
    within HOOK_TOLERANCE of plain DDP, no fp16 overflow)?"""
    path = tmp_path / "builtin_hooks.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def cast_hook(dtype, bucket):
            if dtype == torch.float16:
                return default_hooks.fp16_compress_hook(None, bucket)
            return default_hooks.bf16_compress_hook(None, bucket)
    """))
    checks.cast_hook(path)
    assert "✅ cast_hook" in capsys.readouterr().out


def test_powersgd_converges_and_compresses():
    """Does PowerSGD rank 2 reach >= 85 % in 200 steps, within 3 points of plain DDP,
    sending far fewer bytes?"""
    cfg = compression.CompressionConfig(steps=200, width=256, limit=6000,
                                        test_limit=2000, powersgd_start=10,
                                        slow_steps=2)
    plain, powersgd = _run(compression.train_variants, cfg,
                           ["allreduce", "powersgd-2"])[0]
    assert powersgd["accuracy"] >= 0.85
    assert powersgd["accuracy"] >= plain["accuracy"] - 0.03
    assert powersgd["bytes_first_step"] == plain["bytes_per_step"]   # the warm-up
    assert plain["bytes_per_step"] / powersgd["bytes_per_step"] > 30


def test_unknown_hook_spec_lists_the_valid_ones():
    """Is an unknown hook name refused, naming the valid ones?"""
    with pytest.raises(ValueError, match="'allreduce', 'fp16', 'bf16'"):
        compression.make_hook("top-k", compression.CompressionConfig())


def test_hook_pitfalls_give_the_quoted_messages():
    """Do the on-purpose mistakes produce the exact messages the lab quotes?"""
    seen = _run(compression.hook_pitfalls)[0]
    assert seen["registered twice"].endswith("can only be called once.")
    assert "expected the hook result is a PyObject" in seen["future of the work"]
    assert "must return a torch.futures.Future object" in seen["tensor returned"]
    assert seen["PowerSGD from step 1"].startswith("ValueError: Expect `start_powerSGD")
    assert seen["averaging period 1"].startswith("UserWarning: When period is 1")


# ---------------------------------------------------------------- local SGD, staleness


def test_local_sgd_with_period_1_is_ddp(tmp_path, monkeypatch):
    """Is local SGD averaging every step (plain SGD) the same as DDP, to 1e-5?"""
    (tmp_path / "ddp_twin.py").write_text(textwrap.dedent("""
        import torch
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP
        from labkit.labs.communication.local_sgd import batches, make_model, my_shard

        def train(ctx, cfg):
            images, labels = my_shard(ctx, cfg)
            model = DDP(make_model(cfg))
            optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
            for index in batches(ctx, cfg, len(labels)):
                optimizer.zero_grad()
                F.cross_entropy(model(images[index]), labels[index]).backward()
                optimizer.step()
            return {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    ddp_twin = importlib.import_module("ddp_twin")   # ranks import it from tmp_path too

    cfg = local_sgd.Config(steps=10, period=1, limit=1024)
    twin = _run(ddp_twin.train, cfg)[0]
    local = _run(local_sgd.train, cfg)[0]
    assert local["rounds"] == 10
    assert models.max_difference(twin, local["state"]) < 1e-5


def test_staleness_hurts_at_the_same_learning_rate():
    """Does a delay of 8 steps train worse than no delay (same lr, same data)?"""
    train_split = data.DeviceData.mnist(train=True, limit=4096)
    test_split = data.DeviceData.mnist(train=False, limit=1000)
    fresh = local_sgd.stale_sgd(0, 100, 0.2, train_split, test_split)
    stale = local_sgd.stale_sgd(8, 100, 0.2, train_split, test_split)
    assert fresh["accuracy"] > 0.75
    assert stale["accuracy"] < fresh["accuracy"] - 0.2


# ---------------------------------------------------------------- the bottleneck


def test_profile_step_writes_a_chrome_trace(tmp_path):
    """Does each rank write a Chrome trace and report every phase and the all-reduce?"""
    ranks = _run(bottleneck.profile_step, str(tmp_path), 1, 1)
    for r in ranks:
        assert set(r["phases_ms"]) == set(bottleneck.PHASES)
        assert r["allreduce_ms"] > 0
        assert "traceEvents" in json.loads(open(r["trace"]).read())


def test_straggler_is_the_rank_that_waits_least():
    """With 200 ms of extra work on rank 1, does rank 0 wait and rank 1 not?

    What a loaded machine cannot change: the straggler waits less than the other
    rank, and the other rank's all-reduce cannot finish before the straggler's
    delay is over (its compute plus its wait covers most of it). How much of the
    delay shows as rank 0's wait does depend on the load: at load 16 on 2 cores
    rank 0's own compute took most of the 200 ms, and it waited 59 ms to rank 1's
    31 (a margin of half the delay failed there).
    """
    delay_ms = 200
    ranks = _run(bottleneck.straggler, 6, delay_ms / 1000, 1)
    median = [lambda key, r=r: sorted(s[key] for s in r["steps"])[3] for r in ranks]
    waits = [m("wait") for m in median]
    assert waits[0] > waits[1], waits
    assert median[0]("compute") + waits[0] > delay_ms / 2, (median[0]("compute"), waits)


def test_gpu_monitor_says_when_there_is_no_gpu(monkeypatch):
    """Without nvidia-smi, does the monitor sample nothing and say why?"""
    monkeypatch.setattr(bottleneck.shutil, "which", lambda name: None)
    with bottleneck.GpuMonitor() as gpus:
        pass
    assert not gpus.available and gpus.samples == {}
    assert "no NVIDIA GPU" in gpus.report()


# ---------------------------------------------------------------- the benches


def test_benches_are_registered():
    """Are both lab 06 benches listed for `labkit bench`?"""
    assert {"allreduce", "compression"} <= set(BENCHMARKS)


def test_bench_allreduce_headline(capsys):
    """Does `bench allreduce` measure up to 64 MiB and print busbw at 64 MB last?"""
    from labkit.labs.communication.bench_allreduce import allreduce

    busbw = allreduce()
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"allreduce busbw at 64 MB: {busbw:.2f} GB/s"
    assert 0.01 < busbw < 1000


def test_bench_compression_headline(capsys):
    """Does `bench compression` end with PowerSGD's byte ratio, far above 1?"""
    from labkit.labs.communication.bench_compression import compression_benchmark

    ratio = compression_benchmark(steps=12, width=64, limit=2000)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"powersgd bytes vs plain all-reduce: {ratio:.0f}x"
    assert ratio > 5


def test_labkit_timing_worker_passes_the_exercise_check(tmp_path, capsys):
    """Does labkit's copy of time_allreduce (the bench's) pass the learner's check?"""
    path = tmp_path / "labkit_timing.py"
    path.write_text("from labkit.labs.communication.bench_allreduce import time_allreduce\n")
    checks.allreduce_timing(path)
    assert "✅ time_allreduce" in capsys.readouterr().out


# ---------------------------------------------------------------- exercise hints

BARRIER = ("        dist.barrier()" + " " * 19
           + "# every rank starts the clock together\n")
WARMUP = ("        for _ in range(warmup):" + " " * 10
          + "# connections, buffers, NCCL set-up: not timed\n"
          + "            dist.all_reduce(tensor)\n")
TIMING_MISTAKES = [
    ([(BARRIER, "")], "no dist.barrier"),
    ([(WARMUP + BARRIER, BARRIER + WARMUP)], "comes before the warm-up"),
    ([(WARMUP, "")], "warm up first"),
    ([("statistics.median(samples)", "max(samples)")], "the slowest call (the max)"),
    ([("statistics.median(samples)", "sum(samples)")], "not the total"),
    ([("statistics.median(samples)", "1000 * statistics.median(samples)")],
     "not milliseconds"),
    ([("max(1, n_bytes // 4)", "max(1, n_bytes)")], "a float32 holds 4"),
]


@pytest.mark.parametrize("replace, hint", TIMING_MISTAKES)
def test_timing_mistakes_get_their_hint(tmp_path, replace, hint):
    """Does each classic timing mistake get its own hint?"""
    path = write_program(tmp_path, NOTEBOOK, "allreduce_timing.py", replace)
    with pytest.raises(ExerciseFailed, match=re.escape(hint)):
        checks.allreduce_timing(path)


HOOK_MISTAKES = [
    ([("(buffer / world_size).to(dtype)", "buffer.to(dtype)")],
     "divide by dist.get_world_size()"),
    ([("(buffer / world_size).to(dtype)", "buffer.to(dtype)"),
      ("buffer.copy_(fut.value()[0])", "buffer.copy_(fut.value()[0] / world_size)")],
     "inf or nan came back"),
    ([("return fut.then(decompress)", "return fut")], "your future holds a list"),
    ([("        buffer.copy_(fut.value()[0])" + " " * 22 + "# back into the bucket, "
       "as float32\n        return buffer", "        return fut.value()[0]")],
     "Cast back to the bucket's dtype"),
    ([("buffer.copy_(fut.value()[0])", "fut.value()[0]")], "different gradients"),
    ([("dist.all_reduce(compressed, async_op=True)",
       "dist.all_reduce(buffer.div_(world_size), async_op=True)")],
     "all-reduce the compressed copy"),
    ([("return fut.then(decompress)", "fut.then(decompress)")],
     "A DDP hook must return a Future"),
]


@pytest.mark.parametrize("replace, hint", HOOK_MISTAKES)
def test_hook_mistakes_get_their_hint(tmp_path, replace, hint):
    """Does each classic hook mistake get its own hint?"""
    path = write_program(tmp_path, NOTEBOOK, "cast_hook.py", replace)
    with pytest.raises(ExerciseFailed, match=re.escape(hint)):
        checks.cast_hook(path)


LOCAL_SGD_MISTAKES = [
    ([("            param /= world_size           # ...divided: the mean\n", "")],
     "all_reduce SUMS them"),
    ([("if (step + 1) % cfg.period == 0:", "if True:")], "after every step"),
    ([("if (step + 1) % cfg.period == 0:", "if step % cfg.period == 0:")],
     "the ranks' parameters differ"),
    ([("dist.all_reduce(param)        # the sum over the ranks...",
       "dist.broadcast(param, src=0)")], "dist.broadcast copies rank 0's weights"),
    ([("dist.all_reduce(param)        # the sum over the ranks...",
       "dist.all_reduce(param.grad)")], "not .grad"),
    ([("            rounds += 1\n", "")], "count each averaging round"),
]


@pytest.mark.parametrize("replace, hint", LOCAL_SGD_MISTAKES)
def test_local_sgd_mistakes_get_their_hint(tmp_path, replace, hint):
    """Does each classic local-SGD mistake get its own hint?"""
    path = write_program(tmp_path, NOTEBOOK, "local_sgd_worker.py", replace)
    with pytest.raises(ExerciseFailed, match=re.escape(hint)):
        checks.local_sgd_worker(path)


def test_step_seconds_with_and_without_communication():
    """Do DDP steps and silent side-by-side steps both come back, equal on the ranks?"""
    for sync in (True, False):
        ranks = _run(bottleneck.step_seconds, 64, 2, 1, sync, 2)
        assert len(set(ranks)) == 1 or max(ranks) - min(ranks) < 0.05
        assert 0 < ranks[0] < 5


def test_bucket_timeline_several_buckets_start_during_backward():
    """With a 1 MB cap, are there several buckets, the first all-reduced before the
    backward pass ends; with one bucket, none of it hidden?"""
    several = _run(bottleneck.bucket_timeline, 1.0, 2, 1)[0]
    one = _run(bottleneck.bucket_timeline, 100.0, 2, 1)[0]
    assert len(several["buckets"]) >= 3 and len(one["buckets"]) == 1
    first = several["buckets"][0]
    assert first["ready_ms"] < several["compute_end_ms"]   # started inside backward
    assert sum(b["bytes"] for b in several["buckets"]) == one["buckets"][0]["bytes"]
    assert one["hidden"] == 0.0 and 0.0 <= several["hidden"] <= 1.0


# ---------------------------------------------------------------- on 2 GPUs (NCCL)


@pytest.mark.gpu(2)
def test_profile_step_on_nccl_reports_every_phase_and_the_kernels(tmp_path):
    """On 2 GPUs the profiler adds a GPU-annotation row per label (CPU time 0): is
    every phase still its CPU time (data loading not 0.0), and the all-reduce the
    NCCL kernels' GPU time?"""
    ranks = launch.run(bottleneck.profile_step, 2, args=(str(tmp_path), 2, 2),
                       backend="nccl", timeout=120)
    for r in ranks:
        assert set(r["phases_ms"]) == set(bottleneck.PHASES)
        assert all(ms > 0 for ms in r["phases_ms"].values()), r["phases_ms"]
        assert r["allreduce_ms"] > 0 and r["time"] == "GPU kernel time"
        assert "traceEvents" in json.loads(open(r["trace"]).read())
