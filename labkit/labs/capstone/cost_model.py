"""The capstone's theory: what each rank should hold and send for a layout, and the
alpha-beta prediction of a step on a stated GPU cluster.

Taught in: lab 10 (section 5), next to what the ranks measured. Memory is lab 07's
model (parameters, gradients and optimizer states per rank: fp32, 4 bytes each; SGD
with momentum keeps 1 state, AdamW 2) plus a count of the tensors autograd saves in
this GPT; messages are lab 08's (two all-reduces per block forward, two backward) and
lab 05's (one activation forward and one gradient back per micro-batch); time is lab
06's alpha-beta model with lab 05's bubble. Figures of the GPUs are cited where they
are defined; the efficiency is an assumption, and says so.
"""

import math
from dataclasses import dataclass

from labkit.labs.capstone import layout
from labkit.labs.capstone.transformer_costs import (
    NVLINK_H100,
    Link,
    all_reduce_seconds,
    p2p_seconds,
)
from labkit.messages import N_, Said

__all__ = ["Cluster", "H200_NODE", "params_per_rank", "state_bytes",
           "activation_bytes", "messages", "predict_step"]

FLOAT = 4   # fp32 bytes, what the CPU ranks train in


@dataclass(frozen=True)
class Cluster:
    """GPUs and the link between them; ``efficiency`` of peak FLOP/s is assumed."""

    name: str
    flops_per_s: float
    link: Link
    efficiency: float
    element_bytes: int
    source: str


# NVLink 4 is the H100's and the H200's (900 GB/s in all, 450 each way): the
# planner's link, with its sources (transformer_costs.NVLINK_H100; lab 08 uses the same).
# Said: the name and the source print in the learner's language (a Chinese run).
H200_NODE = Cluster(Said(N_("one node of 8 x H200, NVLink 4")), 989e12, NVLINK_H100, 0.4,
                    2, Said(N_("989 TFLOP/s dense bf16 (NVIDIA H200 datasheet); 40 % of "
                               "it is an ASSUMPTION; bf16 activations and gradients "
                               "(2 bytes)")))


def _block_params(width: int) -> tuple:
    """(split over TP, whole on every TP rank) parameters of one block."""
    split = 12 * width * width + 7 * width     # q k v out fc1 fc2 weights, q k v fc1 b
    whole = 6 * width                          # 2 norms, out and fc2 biases
    return split, whole


def params_per_rank(cfg, rank: int) -> int:
    """The parameters rank ``rank`` holds, counted from the layout's rules."""
    model, where = cfg.model, layout.coords(cfg, rank)
    split, whole = _block_params(model.width)
    count = len(layout.stage_blocks(cfg, where.pp)) * (split // cfg.tp + whole)
    first, last = where.pp == 0, where.pp == cfg.pp - 1
    embedding = model.vocab_size * model.width
    count += (embedding + model.context * model.width) if first else 0
    count += (2 * model.width + (embedding if not first else 0)) if last else 0
    return count


def state_bytes(cfg, rank: int) -> dict:
    """Lab 07's model state per rank, fp32: parameters, gradients, optimizer states."""
    params = params_per_rank(cfg, rank)
    states = 1 if cfg.optimizer == "sgd" else 2   # momentum; Adam's two moments
    return {"parameters": FLOAT * params, "gradients": FLOAT * params,
            "optimizer states": FLOAT * states * params}


def _held(cfg, pp_rank: int) -> int:
    """Micro-batches 1F1B keeps at once on stage ``pp_rank``: min(p - s, m)."""
    return min(cfg.pp - pp_rank, cfg.num_microbatches)


def activation_bytes(cfg, rank: int, batch: int) -> float:
    """What autograd saves at the peak of a 1F1B step on rank ``rank`` (fp32, CPU
    attention), counted per token: a block keeps 4C + 4 floats whole (the norms'
    inputs, outputs and statistics) and 12C + heads split over TP (q, k, v, the
    attention's output and log-sum-exp, fc1's output and GELU's); the last stage its
    norm (2C + 2), the log-probabilities (vocab) and the targets; the first its
    tokens and positions (int64)."""
    model, where = cfg.model, layout.coords(cfg, rank)
    c = model.width
    per_token = len(layout.stage_blocks(cfg, where.pp)) * (
        4 * c + 4 + (12 * c + model.num_heads) / cfg.tp)
    per_token += 2 if where.pp == 0 else 0                      # int64 tokens
    if where.pp == cfg.pp - 1:
        per_token += 2 * c + 2 + model.vocab_size + 2           # ... and targets
    tokens = batch // (cfg.dp * cfg.num_microbatches) * model.context
    positions = 8 * model.context if where.pp == 0 else 0
    return (FLOAT * per_token * tokens + positions) * _held(cfg, where.pp)


def messages(cfg, rank: int, batch: int) -> dict:
    """Per step on rank ``rank``: {dim: (all-reduces, their bytes, messages sent,
    their bytes)}; a dimension of size 1 sends nothing. DP's count is about one per
    bucket_bytes of gradients (buckets close at a tensor's end), plus the loss."""
    model, where = cfg.model, layout.coords(cfg, rank)
    blocks = len(layout.stage_blocks(cfg, where.pp))
    m = cfg.num_microbatches
    activation = FLOAT * batch // (cfg.dp * m) * model.context * model.width
    first, last = where.pp == 0, where.pp == cfg.pp - 1
    found = {dim: (0, 0, 0, 0) for dim in layout.DIMS}
    if cfg.tp > 1:
        found["tp"] = (4 * blocks * m, 4 * blocks * m * activation, 0, 0)
    if cfg.dp > 1:
        grads = FLOAT * params_per_rank(cfg, rank)
        found["dp"] = (math.ceil(grads / cfg.bucket_bytes) + last, grads + FLOAT * last,
                       0, 0)
    if cfg.pp > 1:
        sends = m * ((not last) + (not first))
        tied = int(first or last)
        found["pp"] = (tied, tied * FLOAT * model.vocab_size * model.width, sends,
                       sends * activation)
    return found


def _flops_forward(cfg, pp_rank: int, tokens: int) -> float:
    """Forward FLOPs of one micro-batch on one TP rank of stage ``pp_rank``."""
    model = cfg.model
    split, _whole = _block_params(model.width)   # whole parts: no FLOPs worth it
    blocks = len(layout.stage_blocks(cfg, pp_rank))
    per_token = blocks * (2 * split + 4 * model.context * model.width) / cfg.tp
    if pp_rank == cfg.pp - 1:
        per_token += 2 * model.vocab_size * model.width
    return per_token * tokens


def predict_step(cfg, batch: int, cluster: Cluster = H200_NODE) -> dict:
    """Predict one training step of layout ``cfg`` on ``cluster``: seconds of each
    part of the slowest stage's critical path, and their total (1F1B: (m + p - 1)
    slots of one forward and one backward, the DP all-reduce not hidden)."""
    model, link, m = cfg.model, cluster.link, cfg.num_microbatches
    tokens = batch // (cfg.dp * m) * model.context
    activation = cluster.element_bytes * tokens * model.width
    speed = cluster.flops_per_s * cluster.efficiency
    slowest = max(range(cfg.pp), key=lambda s: _flops_forward(cfg, s, tokens))
    blocks = len(layout.stage_blocks(cfg, slowest))
    compute = 3 * _flops_forward(cfg, slowest, tokens) / speed      # F + B = 3 F
    tp = 4 * blocks * all_reduce_seconds(activation, cfg.tp, link)
    hop = 2 * p2p_seconds(activation, link) if cfg.pp > 1 else 0.0
    slots = m + cfg.pp - 1
    rank = layout.rank_of(cfg, layout.Coords(slowest, 0, 0))
    dp = all_reduce_seconds(cluster.element_bytes * params_per_rank(cfg, rank), cfg.dp,
                            link)
    parts = {"compute": slots * compute, "tp": slots * tp, "pp": slots * hop,
             "dp": dp, "bubble": (cfg.pp - 1) * (compute + tp + hop)}
    parts["total"] = parts["compute"] + parts["tp"] + parts["pp"] + parts["dp"]
    return parts
