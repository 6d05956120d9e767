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


class FakeAverage:
    """One row of ``prof.key_averages()`` as torch builds it (times in us, totals)."""

    def __init__(self, key, device_type, cpu_us, device_us=0.0, count=2):
        self.key, self.device_type, self.count = key, device_type, count
        self.cpu_time_total = self.self_cpu_time_total = cpu_us
        self.device_time_total = device_us


class FakeProfile:
    def __init__(self, rows):
        self.rows = rows

    def key_averages(self):
        return self.rows


def test_phases_come_from_the_cpu_rows_on_a_gpu():
    """With CUDA on, each label has a CPU row and a GPU-annotation row of CPU time 0
    (pytorch#144613): is "data loading" the CPU row's 6 ms, not the annotation's 0?"""
    from torch.autograd import DeviceType

    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    prof = FakeProfile([
        FakeAverage("data loading", cpu, 12_000.0),          # 2 steps: 6 ms each
        FakeAverage("data loading", gpu, 0.0, device_us=40.0),   # the H2D copy
        FakeAverage("forward", cpu, 4_000.0),
        FakeAverage("forward", gpu, 0.0, device_us=3_000.0),
        FakeAverage("backward + all-reduce", cpu, 8_000.0),
        FakeAverage("backward + all-reduce", gpu, 0.0, device_us=7_000.0),
        FakeAverage("optimizer", gpu, 0.0, device_us=100.0),   # before its CPU row
        FakeAverage("optimizer", cpu, 1_000.0),
        FakeAverage("ncclDevKernel_AllReduce_Sum_f32_RING_LL", gpu, 0.0, 5_000.0)])
    rows = bottleneck._rows(prof, steps=2, top=100)
    assert bottleneck._phases_ms(rows) == {"data loading": 6.0, "forward": 2.0,
                                           "backward + all-reduce": 4.0,
                                           "optimizer": 0.5}
    assert bottleneck.allreduce_ms(rows, on_gpu=True) == 2.5


class FakeSmi:
    """nvidia-smi -lms as Popen: what it printed before terminate() cut it short."""

    started: list = []

    def __init__(self, command, stdout=None, text=None):
        FakeSmi.started.append(command)

    def terminate(self):
        pass

    def communicate(self, timeout=None):
        return ("0, 97, 1200\n1, 95, 1180\n0, [N/A], 1200\n1, 96, 1181\n0, 9", None)


def test_gpu_monitor_skips_lines_it_cannot_read(monkeypatch):
    """"[N/A]" (MIG, vGPU) and a line cut short by terminate(): skipped and counted,
    not a ValueError out of float()?"""
    monkeypatch.setattr(bottleneck.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(bottleneck.subprocess, "Popen", FakeSmi)
    with bottleneck.GpuMonitor("cuda") as gpus:
        pass
    assert gpus.samples == {0: [97.0], 1: [95.0, 96.0]}
    assert gpus.unreadable == 2   # "0, [N/A], 1200", and "0, 9" (cut short)
    assert gpus.report().splitlines()[1] == "GPU 1: mean 96 %, peak 96 % (2 samples)"


def test_gpu_monitor_says_when_the_ranks_are_cpu_ranks(monkeypatch):
    """A 1-GPU machine runs the lab's 2 ranks on gloo: does the monitor leave the idle
    GPU unsampled and say the ranks were CPU processes, not report 0 % busy?"""
    FakeSmi.started.clear()
    monkeypatch.setattr(bottleneck.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(bottleneck.subprocess, "Popen", FakeSmi)
    with bottleneck.GpuMonitor("cpu") as gpus:
        pass
    assert FakeSmi.started == [] and gpus.samples == {}
    assert "ranks ran as CPU processes (gloo)" in gpus.report()


def test_gpu_monitor_takes_the_labs_device_by_default(monkeypatch):
    """Without an argument, are the ranks where the lab's labkit.begin put them?"""
    from labkit import hardware

    monkeypatch.setattr(hardware, "_LAB", [hardware.Setup("gloo", "cpu", 2, "1 GPU")])
    assert bottleneck.GpuMonitor().device_type == "cpu"
    monkeypatch.setattr(hardware, "_LAB", [])
    assert bottleneck.GpuMonitor().device_type == "cuda"
