"""Find the bottleneck of a DDP step: a torch.profiler trace (data loading, compute,
all-reduce), a deliberately slow rank, and per-GPU utilisation on GPU machines.

Taught in: lab 06 section 5 (the article's "one GPU busy, the others idle"). The
workers return plain numbers and a trace path; the notebook prints and draws.
"""

import os
import shutil
import sys
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

from labkit import data, hardware, models
from labkit.messages import _
from labkit.train import synchronize

__all__ = ["PHASES", "step_seconds", "profile_step", "allreduce_ms", "Marks",
           "straggler", "draw_straggler", "bucket_timeline", "draw_buckets",
           "GpuMonitor"]

# Profiler labels and the keys of profile_step's "phases_ms": kept as they are.
PHASES = ("data loading", "forward", "backward + all-reduce", "optimizer")


def _ddp(ctx, module):
    module = module.to(ctx.device)
    return DDP(module, device_ids=[ctx.device] if ctx.device.type == "cuda" else None)


def step_seconds(ctx, global_batch: int, steps: int, warmup: int,
                 sync: bool = True, blocks: int = 3) -> float:
    """Return seconds per step of training small_cnn on this rank's share of a batch.

    With several ranks and ``sync`` the model is wrapped in DDP (gradients
    all-reduced every step); ``sync=False`` trains unwrapped copies side by side: the
    compute of a step on this machine with every rank busy, and no communication.
    After ``warmup`` steps, ``blocks`` blocks of ``steps`` steps are timed, each from a
    barrier to a barrier (done when the slowest rank is done); the fastest block
    counts, since other programs on the machine only ever slow a block down.
    """
    per_rank = global_batch // ctx.world_size
    split = data.DeviceData.mnist(train=True, device=ctx.device,
                                  limit=per_rank * (warmup + blocks * steps))
    batches = iter(split.batches(per_rank, generator=torch.Generator().manual_seed(0)))
    torch.manual_seed(0)
    model = models.small_cnn().to(ctx.device)
    if ctx.world_size > 1 and sync:
        model = _ddp(ctx, model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def run(count: int) -> float:
        synchronize(ctx.device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(count):
            images, labels = next(batches)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
        synchronize(ctx.device)
        dist.barrier()
        return (time.perf_counter() - start) / max(count, 1)

    run(warmup)   # DDP builds its buckets, the allocator warms up
    return min(run(steps) for _ in range(blocks))


def _one_step(ctx, model, optimizer, batches) -> None:
    """One training step, each phase under its own profiler label."""
    with record_function(PHASES[0]):
        images, labels = next(batches)   # classic DataLoader: PIL -> tensor, per image
        images, labels = images.to(ctx.device), labels.to(ctx.device)
    with record_function(PHASES[1]):
        loss = F.cross_entropy(model(images), labels)
    with record_function(PHASES[2]):
        optimizer.zero_grad(set_to_none=True)
        loss.backward()   # DDP all-reduces the gradients in here
    with record_function(PHASES[3]):
        optimizer.step()
    synchronize(ctx.device)


def _rows(prof, steps: int, top: int) -> list[dict]:
    """The profiler's key averages as plain rows (ms per step), largest total first.

    ``total_ms`` / ``self_ms`` are CPU time; ``device_ms`` is the time the op's
    kernels ran on the GPU (0 on CPU ranks); ``on`` is "cpu", or "gpu" for a row of
    GPU events (kernels, a label's GPU annotation). On a GPU the CPU side of a
    collective only enqueues it: its cost is in ``device_ms``. Rows sort by the
    larger of the two.
    """
    rows = [{"name": e.key, "calls": e.count // steps,
             "total_ms": e.cpu_time_total / 1e3 / steps,
             "self_ms": e.self_cpu_time_total / 1e3 / steps,
             "device_ms": getattr(e, "device_time_total", 0.0) / 1e3 / steps,
             "on": "cpu" if e.device_type == DeviceType.CPU else "gpu"}
            for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -max(r["total_ms"], r["device_ms"]))[:top]


def _phases_ms(rows: list[dict]) -> dict:
    """Each labelled phase's ms per step, from its CPU row.

    ``key_averages`` groups by device type too: with CUDA on, a ``record_function``
    label has a CPU row and a GPU-annotation row whose CPU time is 0 (pytorch#144613);
    the phase is the CPU row (the step's time on the rank's clock).
    """
    cpu = {row["name"]: row for row in rows if row["on"] == "cpu"}
    return {phase: cpu[phase]["total_ms"] for phase in PHASES if phase in cpu}


def _is_allreduce(name: str) -> bool:
    """gloo:all_reduce, nccl:all_reduce, c10d::allreduce_, ncclDevKernel_AllReduce_."""
    return "allreduce" in name.lower().replace("_", "")


def allreduce_ms(rows: list[dict], on_gpu: bool) -> float:
    """The all-reduce's ms per step from profiler rows: GPU kernel time on a GPU
    (the NCCL kernels' rows), CPU time of the all-reduce ops on CPU ranks."""
    if on_gpu:
        kernels = [r for r in rows if _is_allreduce(r["name"]) and r["total_ms"] == 0
                   and r["device_ms"] > 0]
        if kernels:
            return sum(r["device_ms"] for r in kernels)
        return max((r["device_ms"] for r in rows if _is_allreduce(r["name"])),
                   default=0.0)
    return sum(r["total_ms"] for r in rows if "all_reduce" in r["name"])


@contextmanager
def _quiet_stderr():
    """Send this process's C-level stderr to /dev/null (kineto's start/stop lines).

    Python exceptions still propagate; only the native log lines are dropped.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profile_step(ctx, folder: str, steps: int = 2, warmup: int = 3,
                 batch_per_rank: int = 64, top: int = 12) -> dict:
    """Profile ``steps`` DDP steps of small_cnn fed by the classic DataLoader.

    Writes a Chrome trace per rank into ``folder`` (open it in https://ui.perfetto.dev
    or chrome://tracing). Returns ms per step for each phase, for the all-reduce
    events, and the top rows of the profiler's table.
    """
    loader = data.dataloader(train=True, batch_size=batch_per_rank, num_workers=0,
                             limit=batch_per_rank * (steps + warmup))
    batches = iter(loader)
    torch.manual_seed(0)
    model = _ddp(ctx, models.small_cnn())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _warmup in range(warmup):   # DDP builds its buckets, the allocator warms up
        _one_step(ctx, model, optimizer, batches)
    activities = [ProfilerActivity.CPU]
    if ctx.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    trace = str(Path(folder) / f"ddp_step_rank{ctx.rank}.json")
    with _quiet_stderr():   # kineto logs its start, stop (and "no GPU") on stderr
        with profile(activities=activities) as prof:
            for _step in range(steps):
                _one_step(ctx, model, optimizer, batches)
        prof.export_chrome_trace(trace)
    rows = _rows(prof, steps, top=10**6)
    return {"rank": ctx.rank, "trace": trace, "phases_ms": _phases_ms(rows),
            "allreduce_ms": allreduce_ms(rows, ctx.device.type == "cuda"),
            "time": (_("GPU kernel time") if ctx.device.type == "cuda"
                     else _("CPU time")),
            "top": rows[:top]}


class Marks:
    """Labelled points in time of one step, on the clock that sees the work finish.

    CPU ranks: ``time.perf_counter()``. CUDA ranks: CUDA events recorded on the
    current stream, read after a synchronize, so a point means "the GPU got here".
    (NCCL completes a work's future when the collective is enqueued, not done: a
    CPU clock in ``Future.then`` reads ~0 for the all-reduce on every rank.) A
    ``then`` callback runs on streams synchronised with the collective's, so an event
    recorded there completes when the all-reduce has.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.points: list = []

    def clear(self) -> None:
        self.points.clear()

    def mark(self, label: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.points.append((label, event))
        else:
            self.points.append((label, time.perf_counter()))

    def ms(self, first: str, last: str) -> float:
        """ms from the first point labelled ``first`` to the last labelled ``last``
        (on CUDA, call after ``torch.cuda.synchronize()``)."""
        a = next(p for label, p in self.points if label == first)
        b = next(p for label, p in reversed(self.points) if label == last)
        return a.elapsed_time(b) if self.cuda else 1e3 * (b - a)


def straggler(ctx, steps: int = 10, extra_s: float = 0.0, slow_rank: int = 1) -> dict:
    """Train a few DDP steps; ``slow_rank`` does ``extra_s`` of extra work each step.

    The extra work is a sleep before the forward pass (a rank whose data arrives late,
    or whose GPU is slower). For each step, this rank's timings in ms: ``compute``
    (step start until its first gradient bucket is ready), ``wait`` (until its last
    all-reduce is done: waiting for the slowest rank plus the transfer) and ``step``.
    Read on the CPU clock for CPU ranks, on CUDA events for GPU ranks (``Marks``).
    """
    torch.manual_seed(0)
    model = _ddp(ctx, models.small_cnn())   # 0.1 M parameters: one bucket
    marks = Marks(ctx.device)

    def done(fut):
        marks.mark("done")   # on GPUs: an event after the NCCL kernel
        return fut.value()[0]

    def timed_allreduce(state, bucket):
        marks.mark("ready")   # the bucket is ready: this rank's compute is done
        return default_hooks.allreduce_hook(state, bucket).then(done)

    model.register_comm_hook(None, timed_allreduce)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images, labels = data.random_batch(64, ctx.rank, ctx.device)
    timings = []
    for _step in range(steps + 2):   # the first 2 steps warm up (buckets are rebuilt)
        marks.clear()
        marks.mark("start")
        if ctx.rank == slow_rank and extra_s:
            time.sleep(extra_s)   # the extra work only this rank does
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        marks.mark("end")
        synchronize(ctx.device)
        timings.append({"compute": marks.ms("start", "ready"),
                        "wait": marks.ms("ready", "done"),
                        "step": marks.ms("start", "end")})
    return {"rank": ctx.rank, "steps": timings[2:],
            "clock": _("CUDA events") if marks.cuda else _("CPU clock")}


def bucket_timeline(ctx, bucket_cap_mb: float, steps: int = 4, warmup: int = 2,
                    layers: int = 8, width: int = 384,
                    batch_per_rank: int = 64) -> dict:
    """Time each DDP bucket's all-reduce against the backward pass, on this rank.

    A ``deep_mlp(layers, width)`` (8 x 384: 1.2 M parameters, 4.8 MB of gradients)
    with ``bucket_cap_mb``: one bucket (a cap above 6) or several. For the median
    step (ms since the step began): when each bucket was ready (its gradients
    computed: its all-reduce starts) and done, when the backward pass computed its
    last gradient (``compute_end_ms``) and when the step's backward returned
    (``end_ms``: DDP waits for every bucket). ``hidden`` is the share of the
    all-reduce time that overlapped the backward pass. CPU clock on CPU ranks, CUDA
    events on GPUs (``Marks``). ``bucket_cap_mb`` is given, so DDP's small first
    bucket (1 MiB, used only when the cap is left to its default) does not apply.
    """
    torch.manual_seed(0)
    module = models.deep_mlp(num_layers=layers, width=width).to(ctx.device)
    model = DDP(module, device_ids=[ctx.device] if ctx.device.type == "cuda" else None,
                bucket_cap_mb=bucket_cap_mb)
    marks, plan = Marks(ctx.device), {}
    names = {id(p): n for n, p in module.named_parameters()}

    def hook(state, bucket):
        i = bucket.index()
        marks.mark(f"ready{i}")
        plan[i] = {"bytes": bucket.buffer().numel() * bucket.buffer().element_size(),
                   "params": [names[id(p)] for p in bucket.parameters()]}

        def done(fut):
            marks.mark(f"done{i}")
            return fut.value()[0]
        return default_hooks.allreduce_hook(state, bucket).then(done)

    model.register_comm_hook(None, hook)
    images, labels = data.random_batch(batch_per_rank, ctx.rank, ctx.device)
    timed = []
    for step in range(warmup + steps):   # DDP rebuilds its buckets after step 1
        synchronize(ctx.device)
        dist.barrier()
        marks.clear()
        marks.mark("start")
        loss = F.cross_entropy(model(images), labels)
        marks.mark("forward")
        loss.backward()
        marks.mark("end")
        synchronize(ctx.device)
        if step < warmup:
            continue
        buckets = [{"index": i, **plan[i], "ready_ms": marks.ms("start", f"ready{i}"),
                    "done_ms": marks.ms("start", f"done{i}")} for i in sorted(plan)]
        timed.append({"buckets": buckets, "forward_ms": marks.ms("start", "forward"),
                      "compute_end_ms": max(b["ready_ms"] for b in buckets),
                      "end_ms": marks.ms("start", "end")})
    step = sorted(timed, key=lambda t: t["end_ms"])[len(timed) // 2]
    busy = _union([(b["ready_ms"], b["done_ms"]) for b in step["buckets"]])
    hidden = _union([(a, min(b, step["compute_end_ms"])) for a, b in busy
                     if a < step["compute_end_ms"]])
    total = sum(b - a for a, b in busy)
    return {"rank": ctx.rank, "bucket_cap_mb": bucket_cap_mb, **step,
            "allreduce_ms": total,
            "hidden": sum(b - a for a, b in hidden) / total if total else 0.0,
            "exposed_ms": max(0.0, step["end_ms"] - step["compute_end_ms"]),
            "clock": _("CUDA events") if marks.cuda else _("CPU clock")}


def _union(spans) -> list:
    """Merge (start, end) intervals into disjoint ones."""
    merged: list = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def draw_buckets(runs: dict, ax=None):
    """Draw each run's backward pass and its buckets' all-reduces on one time axis.

    ``runs`` maps a title to one rank's ``bucket_timeline`` result. Returns the Axes.
    """
    import matplotlib.pyplot as plt

    from labkit.timeline import use_cjk_font

    use_cjk_font()
    rows = sum(1 + len(r["buckets"]) for r in runs.values())
    if ax is None:
        _fig, ax = plt.subplots(figsize=(8, 0.9 + 0.28 * rows))
    labels, row = [], 0
    for title, r in runs.items():
        ax.barh(row, r["compute_end_ms"] - r["forward_ms"], left=r["forward_ms"],
                color="#4c72b0")
        labels.append(_("{run}: backward").format(run=title))
        row += 1
        for b in r["buckets"]:
            ax.barh(row, b["done_ms"] - b["ready_ms"], left=b["ready_ms"],
                    color="#c44e52")
            labels.append("  " + _("bucket {index} ({mib:.1f} MiB)").format(
                index=b["index"], mib=b["bytes"] / 2**20))
            row += 1
    ax.set_yticks(range(row), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(_("ms since the step began (median step)"))
    ax.legend([_("computing gradients"), _("all-reduce of a bucket")], fontsize=8,
              loc="lower right")
    return ax


def _median(values) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def draw_straggler(runs: dict, ax=None):
    """Draw each rank's median compute and wait per step, for each named run.

    ``runs`` maps a title ("balanced", "rank 1 slowed") to the list of rank results
    of ``straggler``. Returns the Axes.
    """
    import matplotlib.pyplot as plt

    from labkit.timeline import use_cjk_font

    use_cjk_font()
    if ax is None:
        rows = sum(len(r) for r in runs.values())
        _fig, ax = plt.subplots(figsize=(8, 1 + 0.5 * rows))
    labels, row = [], 0
    for title, ranks in runs.items():
        for result in ranks:
            compute = _median(s["compute"] for s in result["steps"])
            wait = _median(s["wait"] for s in result["steps"])
            ax.barh(row, compute, color="#4c72b0")
            ax.barh(row, wait, left=compute, color="#c44e52")
            labels.append(f"{title}: rank {result['rank']}")
            row += 1
    ax.set_yticks(range(row), labels)
    ax.invert_yaxis()
    ax.set_xlabel(_("ms per step (median)"))
    ax.legend([_("compute (incl. extra work)"), _("waiting in the all-reduce")],
              fontsize=8, loc="lower right")
    return ax


class GpuMonitor:
    """Sample per-GPU utilisation with nvidia-smi while a ``with`` block runs.

    ``samples`` maps a GPU index to its utilisation samples (%). ``device_type``:
    where the ranks measured inside run ("cuda" or "cpu"; default: the lab's, from
    ``labkit.begin``). CPU ranks (gloo, e.g. 2 ranks on a 1-GPU machine) leave the
    GPUs idle, so nothing is sampled and the report says why; so too without
    nvidia-smi (no NVIDIA GPU), where ``available`` is False. Lines nvidia-smi
    cannot fill ("[N/A]" under MIG or vGPU, a line cut short when it is stopped)
    are skipped and counted in ``unreadable``.
    """

    QUERY = ["--query-gpu=index,utilization.gpu,memory.used",
             "--format=csv,noheader,nounits", "-lms", "200"]

    def __init__(self, device_type: str | None = None):
        if device_type is None:
            lab = hardware.lab_setup()
            device_type = lab.device_type if lab else "cuda"
        self.device_type = device_type
        self.available = shutil.which("nvidia-smi") is not None
        self.samples: dict = {}
        self.unreadable = 0
        self._process = None

    def __enter__(self):
        if self.available and self.device_type == "cuda":
            self._process = subprocess.Popen(["nvidia-smi", *self.QUERY],
                                             stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc):
        if self._process is None:
            return
        self._process.terminate()
        out, _ = self._process.communicate(timeout=10)
        self.read(out)

    def read(self, text: str) -> None:
        """Add nvidia-smi's CSV lines (index, utilisation, memory) to ``samples``."""
        for line in text.splitlines():
            try:   # all three fields, or the line is "[N/A]" or cut short
                index, util, memory = (field.strip() for field in line.split(","))
                index, util, _memory = int(index), float(util), float(memory)
            except ValueError:
                self.unreadable += 1
                continue
            self.samples.setdefault(index, []).append(util)

    def report(self) -> str:
        """One line per GPU: mean and peak utilisation over the samples."""
        if not self.available:
            return _("No nvidia-smi here (no NVIDIA GPU): per-GPU utilisation is "
                     "measured on GPU machines only.")
        if self.device_type != "cuda":
            return _("The ranks ran as CPU processes (gloo), not on this machine's "
                     "GPU(s): their utilisation says nothing about these ranks, so it "
                     "was not sampled. With a GPU per rank, NCCL puts them there.")
        if not self.samples:
            return _("nvidia-smi gave no utilisation ({count} line(s) it could not "
                     "fill, such as [N/A] under MIG or vGPU).").format(
                         count=self.unreadable)
        return "\n".join(
            _("GPU {index}: mean {mean:.0f} %, peak {peak:.0f} % ({count} samples)"
              ).format(index=index, mean=sum(u) / len(u), peak=max(u), count=len(u))
            for index, u in sorted(self.samples.items()))
