"""Lab 06's GPU paths, proven on CPU with fakes: the straggler's clock reads CUDA
events (not the CPU clock in ``Future.then``, which NCCL completes at enqueue), and
the profiler's all-reduce is the NCCL kernels' device time (not the enqueue's CPU
time). What a CPU cannot prove: that real NCCL events land where the fakes do.
"""

import torch

from labkit.labs.communication import bottleneck


class FakeEvent:
    """A CUDA event whose GPU time is set by the test (ms since the step began)."""

    gpu_now = 0.0
    made: list = []

    def __init__(self, enable_timing=False):
        assert enable_timing, "elapsed_time needs enable_timing=True"
        self.at = None
        FakeEvent.made.append(self)

    def record(self, stream=None):
        self.at = FakeEvent.gpu_now

    def elapsed_time(self, other):
        return other.at - self.at


def test_marks_on_cuda_read_events_not_the_cpu_clock(monkeypatch):
    """On a CUDA device, do the marks come from events, whatever the CPU clock says?"""
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(bottleneck.time, "perf_counter",
                        lambda: (_ for _ in ()).throw(AssertionError("CPU clock read")))
    marks = bottleneck.Marks(torch.device("cuda", 0))
    for label, gpu_ms in (("start", 0.0), ("ready", 40.0), ("done", 41.0),
                          ("done", 70.0), ("end", 72.0)):
        FakeEvent.gpu_now = gpu_ms   # the GPU reached this point then
        marks.mark(label)
    assert marks.ms("start", "ready") == 40.0
    assert marks.ms("ready", "done") == 30.0   # to the LAST all-reduce done
    assert marks.ms("start", "end") == 72.0


def test_marks_on_cpu_use_the_cpu_clock():
    """On CPU ranks, are the marks perf_counter points in ms?"""
    marks = bottleneck.Marks(torch.device("cpu"))
    marks.mark("start")
    marks.mark("end")
    assert 0 <= marks.ms("start", "end") < 1000 and not marks.cuda


def test_allreduce_time_on_gpu_is_the_kernels_device_time():
    """With NCCL rows as the profiler gives them, is the all-reduce the kernel time?"""
    rows = [{"name": "nccl:all_reduce", "total_ms": 0.02, "device_ms": 3.0},
            {"name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "total_ms": 0.0,
             "device_ms": 3.0},
            {"name": "aten::convolution", "total_ms": 1.0, "device_ms": 2.0}]
    assert bottleneck.allreduce_ms(rows, on_gpu=True) == 3.0
    cpu_rows = [{"name": "gloo:all_reduce", "total_ms": 1.5, "device_ms": 0.0}]
    assert bottleneck.allreduce_ms(cpu_rows, on_gpu=False) == 1.5
