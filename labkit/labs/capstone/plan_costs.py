"""What one plan costs: the bytes on each pipeline stage's GPUs and the seconds of
a step, split by where they go.

Taught in: lab 10 ("plan a real run"); ``planner`` wraps these in its dataclasses.

- memory, per GPU, on every pipeline stage (the fullest one counts): the stage's
  share of the training state (split by tp, then sharded by ZeRO over dp: lab 07)
  plus the activations of the micro-batches in flight there (lab 05's schedule table
  says how many), split by tp (sequence parallelism: Korthikanti et al. 2022);
- a step, on the slowest stage: per micro-batch, compute + the TP all-reduces (4 per
  block, 6 with checkpointing: Megatron-LM's layout) + the sends to the next stage;
  the bubble (p-1)/(v*m) of ideal time on top (lab 05); then the DP traffic (lab 06)
  that compute cannot hide.

A plan is anything with planner.Plan's fields, a case anything with Case's.
Not modelled: the optimizer step itself, the embedding's and loss's collectives,
FSDP's gathered working copy of one or two blocks (under 1 GiB at these sizes), and
any overlap of TP or pipeline traffic with compute (torchtitan's async TP and
Megatron-LM's --tp-comm-overlap hide part of it).
"""

from labkit import pipeline
from labkit.labs.capstone import transformer_costs as cm

__all__ = ["STATE_BYTES", "layers_per_stage", "in_flight", "state_bytes",
           "first_stage_bytes", "memory", "step_time"]

STATE_BYTES = {"parameters": 2, "gradients": 2, "optimizer states": 12}  # lab 07
_SHARDED_FROM = {"optimizer states": 1, "gradients": 2, "parameters": 3}  # ZeRO stage


# ---------------------------------------------------------------- memory


def layers_per_stage(layers: int, pp: int) -> list[int]:
    """Blocks on each pipeline stage, as even as can be (the first get one more)."""
    base, extra = divmod(layers, pp)
    return [base + (stage < extra) for stage in range(pp)]


def in_flight(schedule: str, pp: int, m: int, chunks: int = 1) -> tuple[int, ...]:
    """Micro-batch chunks whose activations each stage holds at most (lab 05).

    GPipe holds all m; 1F1B min(m, pp - stage), its warm-up; interleaved 1F1B
    min(2 (pp - stage - 1) + (chunks - 1) pp + 1, m chunks), Megatron-LM's warm-up
    count. tests/labs/capstone checks all three against lab 05's schedule tables
    (``pipeline.peak_activations``), which take too long to build in a search.
    """
    if pp == 1:
        return (1,)
    if schedule == "gpipe":
        return (m,) * pp
    if schedule == "1f1b":
        return tuple(min(m, pp - stage) for stage in range(pp))
    return tuple(min(2 * (pp - stage - 1) + (chunks - 1) * pp + 1, m * chunks)
                 for stage in range(pp))


def _stage_params(model: cm.ModelShape, layers: int, stage: int, pp: int) -> int:
    first, last = stage == 0, stage == pp - 1
    return (layers * model.layer_params + first * model.embedding_params
            + last * model.output_params)


def state_bytes(params_per_gpu: float, dp: int, zero_stage: int) -> dict:
    """Lab 07: {kind: bytes}; ZeRO stage s shards the first s kinds over dp."""
    return {kind: params_per_gpu * width / (dp if zero_stage >= _SHARDED_FROM[kind]
                                            else 1)
            for kind, width in STATE_BYTES.items()}


def _stage_memory(case, plan, stage: int, layers: int) -> dict:
    model = case.model
    tokens = plan.microbatch_size(case) * case.seq_len   # one micro-batch, one stage
    parts = state_bytes(_stage_params(model, layers, stage, plan.pp) / plan.tp,
                         plan.dp, plan.zero_stage)
    held = in_flight(plan.schedule, plan.pp, plan.num_microbatches, plan.num_chunks)
    chunks_held, per_chunk = held[stage], layers / plan.num_chunks
    full = model.activation_bytes_per_token * tokens / plan.tp
    if plan.checkpointing:   # inputs of every held block, and one block rebuilt
        kept = model.checkpoint_bytes_per_token * tokens / plan.tp
        activations = chunks_held * per_chunk * kept + full
    else:
        activations = chunks_held * per_chunk * full
    if stage == plan.pp - 1:
        activations += model.logits_bytes_per_token * tokens / plan.tp
    parts["activations"] = activations
    return parts


def first_stage_bytes(case, plan) -> dict:
    """{kind: bytes} on a GPU of the first pipeline stage (the reference answer of
    the memory exercise)."""
    return _stage_memory(case, plan, 0, layers_per_stage(case.model.layers, plan.pp)[0])


def memory(case, plan) -> tuple[int, dict]:
    """(stage, {kind: bytes}) of the fullest stage's GPU (every stage looked at)."""
    per_stage = [_stage_memory(case, plan, s, n)
                 for s, n in enumerate(layers_per_stage(case.model.layers, plan.pp))]
    worst = max(range(plan.pp), key=lambda s: sum(per_stage[s].values()))
    return worst, per_stage[worst]


# ---------------------------------------------------------------- time


def _microbatch_seconds(case, plan) -> tuple[float, float]:
    """(compute, TP) seconds of one micro-batch on the slowest stage."""
    model, cluster, s = case.model, case.cluster, case.seq_len
    tokens = plan.microbatch_size(case) * s
    recompute = 4 / 3 if plan.checkpointing else 1.0   # one more forward per block
    tp_link = cluster.link(plan.tp, stride=1)
    activation = tokens * model.hidden * cm.BYTES_16BIT   # what TP all-reduces
    slowest = (0.0, 0.0)
    stages = layers_per_stage(model.layers, plan.pp)
    for stage, layers in enumerate(stages):
        flops = layers * model.layer_flops_per_token(s) * recompute
        if stage == plan.pp - 1:
            flops += model.output_flops_per_token
        compute = flops * tokens / plan.tp / cluster.flops_per_s
        calls = layers * (6 if plan.checkpointing else 4)
        tp = cm.all_reduce_seconds(calls * activation, plan.tp, tp_link, calls)
        if compute + tp > sum(slowest):
            slowest = (compute, tp)
    return slowest


def _dp_seconds(case, plan, compute_mb: float) -> float:
    """DP traffic of one step that compute does not hide.

    ZeRO 0 (DDP): one all-reduce of the gradients, hidden behind the last
    micro-batch's backward. ZeRO 1: a reduce-scatter of the gradients (hidden
    behind that backward) and an all-gather of the updated parameters (hidden behind
    the next step's first forward, as Megatron-LM's --overlap-param-gather does).
    ZeRO 2 shards the gradients, so they cannot accumulate whole over the
    micro-batches: each micro-batch's backward reduce-scatters its own (m of them,
    each hidden behind its backward), then one all-gather as for ZeRO 1.
    ZeRO 3 (FSDP): parameters all-gathered for each micro-batch's forward and again
    for its backward, gradients reduce-scattered once; hidden behind all compute.
    """
    if plan.dp == 1:
        return 0.0
    model, cluster = case.model, case.cluster
    stages = layers_per_stage(model.layers, plan.pp)
    params = max(_stage_params(model, n, s, plan.pp) for s, n in enumerate(stages))
    grad_bytes = params / plan.tp * STATE_BYTES["gradients"]
    link = cluster.link(plan.dp, stride=plan.tp)
    calls = cm.bucket_calls(grad_bytes)
    gather = cm.gather_seconds(grad_bytes, plan.dp, link, calls)
    backward = (3 / 4 if plan.checkpointing else 2 / 3) * compute_mb
    if plan.zero_stage == 0:
        traffic = cm.all_reduce_seconds(grad_bytes, plan.dp, link, calls)
        return max(0.0, traffic - backward)
    if plan.zero_stage < 3:
        scatters = plan.num_microbatches if plan.zero_stage == 2 else 1
        return (scatters * max(0.0, gather - backward)
                + max(0.0, gather - (compute_mb - backward)))
    traffic = (2 * plan.num_microbatches + 1) * gather
    return max(0.0, traffic - plan.num_microbatches * compute_mb)


def step_time(case, plan) -> dict:
    """Seconds of one optimizer step, split by where they go: {compute, tp, pp, dp}."""
    compute_mb, tp_mb = _microbatch_seconds(case, plan)
    m, p, v = plan.num_microbatches, plan.pp, plan.num_chunks
    send = 0.0
    if p > 1:   # each chunk sends its output forward and its input's gradient back
        tokens = plan.microbatch_size(case) * case.seq_len
        n_bytes = tokens * case.model.hidden * cm.BYTES_16BIT / plan.tp
        link = case.cluster.link(p, stride=plan.tp * plan.dp)
        send = cm.p2p_seconds(2 * v * n_bytes, link, calls=2 * v)
    per_mb = compute_mb + tp_mb + send
    bubble = per_mb * m * pipeline.bubble_overhead(p, m, v) if p > 1 else 0.0
    return {"compute": m * compute_mb, "tp": m * tp_mb, "pp": m * send + bubble,
            "dp": _dp_seconds(case, plan, compute_mb)}
