"""Published layouts of real runs, with what they measured, to hold the planner's
models against: torchtitan's Llama 3.1 benchmarks, the Llama 3 paper's 405 B run and
Megatron-LM's H100 scaling table.

Taught in: lab 10 ("compare with the field"). Each ``Run`` says where its numbers
come from; ``Run.layout()`` is the published layout as a ``planner.Plan``, what the
source leaves unsaid filled in as ``assumed`` says (where that is "the planner's
best", the fastest plan that fits with every published field kept). ``compare``
scores it and sets the prediction beside the published figure.
"""

from dataclasses import dataclass, field, replace

from labkit.labs.capstone import transformer_costs as cm
from labkit.labs.capstone import planner
from labkit.messages import N_, _

__all__ = ["Run", "TORCHTITAN", "LLAMA3_PAPER", "MEGATRON", "ALL_RUNS", "compare",
           "print_comparison"]

# torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (pytorch/torchtitan at
# b5bcd76c): Grand Teton hosts, 8 H100 on NVLink, 400 Gb/s RDMA per GPU, each GPU
# "96GB HBM2e" at a 500 W limit (their memory column is GiB, so 96 GiB here); its
# peak is "between SXM and NVL", the benchmark counts MFU against SXM's 989 TFLOP/s.
_TITAN_SOURCE = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"


def _titan_cluster(nodes: int) -> cm.Cluster:
    return cm.h100_cluster(nodes, name=_("{nodes} x 8 H100 96GB HBM2e, 500 W").format(
        nodes=nodes), gpu_bytes=96 * 2**30)


@dataclass(frozen=True)
class Run:
    """One published run: its case, its layout, what it measured, and its source."""

    name: str
    source: str
    case: planner.Case
    plan: planner.Plan
    measured: dict                 # tokens_per_s_per_gpu, tflops_per_gpu, mfu, gib
    assumed: str = ""
    notes: str = ""
    completed: tuple = ()          # Plan fields the source leaves out: the planner's
    search: dict = field(default_factory=dict)   # best choice fills them in
    selective: bool = False        # selective checkpointing: between our off and on

    def layout(self) -> planner.Plan:
        """The published plan; fields in ``completed`` are the fastest fitting
        choice the planner finds, the others as published."""
        if not self.completed:
            return self.plan
        kept = [f for f in _PLAN_FIELDS if f not in self.completed]

        def published(plan):
            return all(getattr(plan, f) == getattr(self.plan, f) for f in kept)

        best = planner.best_plans(self.case, top=1, where=published, **self.search)
        return best[0].plan if best else self.plan


_PLAN_FIELDS = ("dp", "tp", "pp", "num_microbatches", "checkpointing", "zero_stage",
                "schedule", "num_chunks")
_UNSAID = ("num_microbatches", "checkpointing", "schedule", "num_chunks")
_SCHEDULES = (("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4))
_8B, _70B, _405B = cm.LLAMA3["8B"], cm.LLAMA3["70B"], cm.LLAMA3["405B"]
TORCHTITAN = [
    Run("torchtitan 8B, FSDP 8 (Table 1)", _TITAN_SOURCE,
        planner.Case("8B on 1 node", _8B, _titan_cluster(1), 8192, 16),
        planner.Plan(dp=8, tp=1, pp=1, num_microbatches=1, zero_stage=3),
        {"tokens_per_s_per_gpu": 5762, "gib": 82.4},
        assumed=N_("seq_len 8192 (llama3_8b.toml); local batch 2 in one micro-batch"),
        notes=N_("selective activation checkpointing: between our 'off' and 'on'"),
        selective=True),
    Run("torchtitan 8B, FSDP 128 (Table 3)", _TITAN_SOURCE,
        planner.Case("8B on 16 nodes", _8B, _titan_cluster(16), 8192, 256),
        planner.Plan(dp=128, tp=1, pp=1, num_microbatches=1, zero_stage=3),
        {"tokens_per_s_per_gpu": 5605, "gib": 67.0},
        assumed=N_("as Table 1"), notes=N_("selective activation checkpointing"),
        selective=True),
    Run("torchtitan 70B, FSDP 32 x TP 8 (Table 4)", _TITAN_SOURCE,
        planner.Case("70B on 32 nodes", _70B, _titan_cluster(32), 8192, 512),
        planner.Plan(dp=32, tp=8, pp=1, num_microbatches=1, checkpointing=True,
                     zero_stage=3),
        {"tokens_per_s_per_gpu": 829, "gib": 71.9},
        assumed=N_("local batch 16 in one micro-batch"),
        notes=N_("Float8 matmuls, compiled")),
    Run("torchtitan 405B, FSDP 8 x TP 8 x PP 8, 1F1B (Table 5)", _TITAN_SOURCE,
        planner.Case("405B on 64 nodes", _405B, _titan_cluster(64), 8192, 256),
        planner.Plan(dp=8, tp=8, pp=8, num_microbatches=32, checkpointing=True,
                     zero_stage=3),
        {"tokens_per_s_per_gpu": 100, "gib": 82.5},
        assumed=N_("micro-batch size 1 (torchtitan's default): 32 micro-batches"),
        notes=N_("Float8 matmuls, compiled, async TP")),
]

# Dubey et al. 2024, "The Llama 3 Herd of Models" (arXiv:2407.21783), Table 4:
# 405 B, sequence 8192, 16 M tokens (2048 sequences) per step, H100 SXM 80 GB, BF16.
_LLAMA3_SOURCE = "Dubey et al. 2024 (arXiv:2407.21783), Table 4"
LLAMA3_PAPER = [
    Run(f"Llama 3 405B on {gpus:,} GPUs: TP 8, PP 16, DP {dp}", _LLAMA3_SOURCE,
        planner.Case(f"405B on {gpus // 8} nodes", _405B, cm.h100_cluster(gpus // 8),
                     8192, 2048),
        planner.Plan(dp=dp, tp=8, pp=16, num_microbatches=2048 // dp, zero_stage=2,
                     schedule="interleaved_1f1b", num_chunks=2),
        {"tflops_per_gpu": tflops, "mfu": mfu},
        assumed=N_("ZeRO-2 for its FSDP that keeps parameters gathered in the step; "
                "micro-batches, checkpointing and interleaving depth: the planner's "
                "best (the paper names the interleaved schedule, not its depth)"),
        completed=_UNSAID, search={"schedules": _SCHEDULES[1:], "zero_stages": (2,)})
    for gpus, dp, tflops, mfu in ((8192, 64, 430, 0.43), (16384, 128, 400, 0.41))]

# Megatron-LM README, "Performance Benchmarking", images/model_table.png
# (NVIDIA/Megatron-LM at f2e5db40): GPT models, vocabulary 131,072, sequence 4,096,
# H100; layers, hidden, heads, TP, PP, DP, batch (sequences), TFLOP/s per GPU, MFU.
_MEGATRON_SOURCE = "NVIDIA/Megatron-LM README, images/model_table.png"
_MEGATRON_ROWS = [
    ("1.7B", 24, 2048, 16, 1, 1, 48, 192, 408.8, 0.41),
    ("7.1B", 30, 4096, 32, 2, 1, 48, 192, 465.9, 0.47),
    ("16B", 32, 6144, 48, 4, 1, 48, 192, 489.1, 0.49),
    ("32B", 48, 7168, 56, 8, 1, 48, 192, 459.6, 0.46),
    ("70B", 84, 8192, 64, 8, 2, 48, 384, 419.7, 0.42),
    ("119B", 92, 10240, 80, 8, 4, 48, 768, 420.5, 0.43),
    ("177B", 96, 12288, 96, 8, 6, 48, 1152, 432.8, 0.44),
    ("314B", 96, 16384, 128, 8, 8, 48, 1536, 474.4, 0.48),
    ("462B", 112, 18432, 144, 8, 16, 48, 3072, 459.9, 0.47),
]


def _megatron_run(row) -> Run:
    name, layers, hidden, heads, tp, pp, dp, batch, tflops, mfu = row
    shape = cm.ModelShape(f"GPT {name}", layers, hidden, heads, heads, 4 * hidden,
                          131072, gated_mlp=False)
    nodes = tp * pp * dp // 8
    return Run(f"Megatron-LM GPT {name}: TP {tp}, PP {pp}, DP {dp}", _MEGATRON_SOURCE,
               planner.Case(f"GPT {name} on {nodes} nodes", shape,
                            cm.h100_cluster(nodes), 4096, batch),
               planner.Plan(dp=dp, tp=tp, pp=pp, num_microbatches=batch // dp,
                            zero_stage=1),
               {"tflops_per_gpu": tflops, "mfu": mfu},
               assumed=N_("the distributed optimizer (ZeRO-1); micro-batches, "
                       "checkpointing and interleaving: the planner's best"),
               completed=_UNSAID,
               search={"schedules": _SCHEDULES, "zero_stages": (1,)})


MEGATRON = [_megatron_run(row) for row in _MEGATRON_ROWS]
ALL_RUNS = TORCHTITAN + LLAMA3_PAPER + MEGATRON


def compare(run: Run) -> dict:
    """Score the published layout; return ``fits``, ``score`` (the planner's Score)
    and ``figures``: {figure: (predicted, published, error)}, ``error`` being
    predicted / published - 1 (+0.20: we predict 20 % more).

    A run with selective checkpointing keeps part of what full checkpointing drops:
    its memory is predicted as the range from checkpointing on to off (``bracket``:
    (on, off) GiB), its error 0 inside that range, and it fits when it fits with
    checkpointing on (a run that trained is never called "does not fit" for the
    part of its memory the model cannot place)."""
    got = planner.score(run.layout(), run.case)
    predicted = {"tokens_per_s_per_gpu": got.tokens_per_s_per_gpu, "mfu": got.mfu,
                 "tflops_per_gpu": got.mfu * run.case.cluster.peak_flops / 1e12,
                 "gib": got.memory.total / planner.GIB}
    rows = {key: (predicted[key], value, predicted[key] / value - 1)
            for key, value in run.measured.items()}
    found = {"fits": got.memory.fits, "score": got, "figures": rows, "bracket": None}
    if run.selective and "gib" in run.measured:
        on = planner.score(replace(run.layout(), checkpointing=True), run.case).memory
        low, high = on.total / planner.GIB, got.memory.total / planner.GIB
        value = run.measured["gib"]
        error = 0.0 if low <= value <= high else (low if value < low else high) / value - 1
        rows["gib"] = (high, value, error)
        found.update(bracket=(low, high), fits=on.fits)
    return found


_FIGURES = {"tokens_per_s_per_gpu": ("tokens/s/GPU", "{:,.0f}"),
            "tflops_per_gpu": ("TFLOP/s/GPU", "{:,.0f}"), "mfu": ("MFU", "{:.1%}"),
            "gib": ("GiB", "{:.1f}")}


def _figure(key: str, predicted: float, published: float, error: float) -> str:
    label, form = _FIGURES[key]
    return _("{label} {predicted} vs {published} ({error:+.0%})").format(
        label=label, predicted=form.format(predicted), published=form.format(published),
        error=error)


def _bracket(published: float, low: float, high: float) -> str:
    where = _("inside") if low <= published <= high else _("outside")
    return _("GiB {low:.1f} (checkpointing on) to {high:.1f} (off) vs {published:.1f}: "
             "{where}").format(low=low, high=high, published=published, where=where)


def print_comparison(runs=None) -> None:
    """Print each run's layout, its predicted and published figures with the error,
    what was assumed, and the source."""
    for run in runs or ALL_RUNS:
        result = compare(run)
        figures = "; ".join(_figure(key, *row) if not (key == "gib" and result["bracket"])
                            else _bracket(row[1], *result["bracket"])
                            for key, row in result["figures"].items())
        print(_("{name} ({fits}): predicted vs published: {figures}\n"
                "    scored as {plan}; assumed: {assumed}{notes}\n    source: {source}"
                ).format(name=run.name, fits=_("fits") if result["fits"] else
                         _("DOES NOT FIT"), figures=figures,
                         plan=result["score"].plan,
                         assumed=_(run.assumed) if run.assumed else "-",
                         notes=f"; {_(run.notes)}" if run.notes else "",
                         source=run.source))
