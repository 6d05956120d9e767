"""What a transformer costs: its parameters, FLOPs, activation bytes, and the time of
a collective on a link; the models and the cluster a plan is scored on.

Taught in: lab 10 ("plan a real run"). The formulas are the course's own, restated
here so that lab 10's room imports no other lab's module:

- bytes of the training state per GPU: lab 07 (ZeRO's 2 + 2 + 12 bytes per parameter,
  sharded stage by stage over the data-parallel group);
- activation bytes: lab 07's Korthikanti et al. 2022 count, per token and per layer,
  for a Llama block (grouped-query attention, SwiGLU) and with flash attention, which
  stores no s x s score matrix (so lab 07's ``5*a*s/h`` term is gone);
- a collective's time: lab 06's alpha-beta model, one latency per call plus the
  bytes each GPU sends over the link: ring all-reduce 2(n-1)/n, all-gather and
  reduce-scatter (n-1)/n of the full tensor, point-to-point 1;
- FLOPs per token: 6 per parameter (forward 2, backward 4) plus attention's
  12 * layers * hidden * seq_len, as torchtitan counts them
  (torchtitan/models/utils.py, get_dense_model_nparams_and_flops).

Units: bytes, seconds, FLOP; GB = 10**9 bytes, GiB = 2**30.
"""

import math
from dataclasses import dataclass

from labkit.messages import _

__all__ = ["ModelShape", "LLAMA3", "Link", "Cluster", "h100_cluster",
           "all_reduce_seconds", "gather_seconds", "p2p_seconds"]

BYTES_16BIT = 2      # bf16 parameters, gradients and activations
LOGIT_BYTES = 4      # Korthikanti et al. 2022, sec. 4.3: the logits are kept in fp32


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape; ``gated_mlp``: SwiGLU's 3 matrices (Llama)
    rather than GeLU's 2 (GPT)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    gated_mlp: bool = True

    @property
    def layer_params(self) -> int:
        """Parameters of one block: q and o (h x h), k and v (h x kv), MLP, 2 norms."""
        kv_width = self.hidden * self.kv_heads // self.heads
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv_width
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.ffn
        return attention + mlp + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        """The token embedding (vocab x hidden), on the first pipeline stage."""
        return self.vocab * self.hidden

    @property
    def output_params(self) -> int:
        """The final norm and the (untied) output projection, on the last stage."""
        return self.vocab * self.hidden + self.hidden

    @property
    def num_params(self) -> int:
        return (self.layers * self.layer_params + self.embedding_params
                + self.output_params)

    def layer_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs of one block per token: 6 x its parameters + attention."""
        return 6 * self.layer_params + 12 * self.hidden * seq_len

    @property
    def output_flops_per_token(self) -> float:
        """Training FLOPs of the output projection per token (the lookup costs none)."""
        return 6 * self.output_params

    def model_flops_per_token(self, seq_len: int) -> float:
        """torchtitan's FLOPs per token of a training step (what MFU counts)."""
        return (self.layers * self.layer_flops_per_token(seq_len)
                + self.output_flops_per_token)

    @property
    def activation_bytes_per_token(self) -> int:
        """Bytes one block saves for its backward, per token (16-bit, flash attention).

        Attention: the norm's input and output, q, k and v, the attention output;
        MLP: the norm's input and output, then the gate, up and their product
        (SwiGLU) or the GeLU's input and output. Llama 3 8B: 34 x hidden, lab 07's
        constant; a GPT block: 32 x hidden (no dropout masks here).
        """
        h, kv_width = self.hidden, self.hidden * self.kv_heads // self.heads
        attention = 4 * h + 2 * kv_width
        mlp = 2 * h + (3 if self.gated_mlp else 2) * self.ffn
        return BYTES_16BIT * (attention + mlp)

    @property
    def checkpoint_bytes_per_token(self) -> int:
        """Bytes a checkpointed block keeps per token: its input only."""
        return BYTES_16BIT * self.hidden

    @property
    def logits_bytes_per_token(self) -> int:
        """Bytes of the logits the loss keeps, per token (fp32, on the last stage)."""
        return LOGIT_BYTES * self.vocab


# Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3; the same numbers
# are torchtitan's flavors in torchtitan/models/llama3/__init__.py): layers, hidden,
# heads, kv heads, FFN width, vocabulary. Head width 128 throughout.
LLAMA3 = {
    "8B": ModelShape("Llama 3 8B", 32, 4096, 32, 8, 14336, 128256),
    "70B": ModelShape("Llama 3 70B", 80, 8192, 64, 8, 28672, 128256),
    "405B": ModelShape("Llama 3 405B", 126, 16384, 128, 8, 53248, 128256),
}


@dataclass(frozen=True)
class Link:
    """One kind of link: ``alpha`` seconds per collective call, ``beta`` bytes per
    second that NCCL reaches on it (less than the line rate), and where both come
    from."""

    name: str
    alpha: float
    beta: float
    source: str


# NVLink 4 between the 8 GPUs of an HGX H100: 450 GB/s each way is the line rate
# (NVIDIA H100 datasheet: 900 GB/s in all); NCCL's ring reaches about 370 GB/s of it
# (NVIDIA/nccl-tests#212). alpha: about 6 us for an all-reduce on 2 H100 over NVLink
# (NVIDIA/nccl#1259).
NVLINK_H100 = Link("NVLink 4", 6e-6, 370e9,
                   "NVIDIA/nccl-tests#212 (beta), NVIDIA/nccl#1259 (alpha)")
# InfiniBand NDR, one 400 Gb/s NIC per GPU: 50 GB/s line rate; "for NDR @ 400Gbps
# you should see 46-48GB/s per NIC" (NVIDIA, NVIDIA/nccl-tests#290). alpha: an 8-byte
# all-reduce between 2 nodes over InfiniBand took 19.9 us (NVIDIA/nccl-tests#150).
INFINIBAND_NDR = Link("InfiniBand NDR 400 Gb/s", 20e-6, 47e9,
                      "NVIDIA/nccl-tests#290 (beta), NVIDIA/nccl-tests#150 (alpha)")

# H100 SXM: 989 TFLOP/s dense bf16 (NVIDIA H100 datasheet; torchtitan's
# tools/utils.py uses the same peak for MFU). Memory: nvidia-smi reports 81,559 MiB on
# an "H100 80GB HBM3" (NVIDIA/nccl#1264). Keep 10 % of it free for the CUDA context,
# NCCL's buffers and fragmentation (lab 07 leaves 10-20 %): an assumption.
H100_PEAK_FLOPS = 989e12
H100_BYTES = 81559 * 2**20
RESERVED_SHARE = 0.10
# The share of the peak the kernels reach while they compute, before any
# communication or bubble: an ASSUMPTION, set near the best end-to-end MFU of
# Megatron-LM's H100 table (49 % for its 16 B model, README), so that the other
# published runs test the overhead models, not this number.
COMPUTE_EFFICIENCY = 0.50


@dataclass(frozen=True)
class Cluster:
    """Nodes of ``gpus_per_node`` GPUs: ``intra`` links inside a node, ``inter``
    between nodes (one NIC per GPU)."""

    name: str
    nodes: int
    gpus_per_node: int
    peak_flops: float
    gpu_bytes: float
    intra: Link
    inter: Link
    compute_efficiency: float = COMPUTE_EFFICIENCY
    reserved_share: float = RESERVED_SHARE

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def usable_bytes(self) -> float:
        """What a plan may fill on one GPU."""
        return self.gpu_bytes * (1 - self.reserved_share)

    @property
    def flops_per_s(self) -> float:
        """FLOP/s one GPU sustains while it computes."""
        return self.peak_flops * self.compute_efficiency

    def link(self, size: int, stride: int) -> Link:
        """The slowest link a group of ``size`` GPUs, ``stride`` ranks apart, crosses.

        Ranks fill a node before the next (tp innermost, then dp, then pp outermost,
        torchtitan's mesh order in torchtitan/distributed/parallel_dims.py).
        """
        return self.intra if size * stride <= self.gpus_per_node else self.inter


def h100_cluster(nodes: int, **changes) -> Cluster:
    """Return ``nodes`` HGX H100 SXM nodes: 8 GPUs on NVLink, 400 Gb/s IB per GPU."""
    if type(nodes) is not int or nodes < 1:
        raise ValueError(_("nodes must be a positive integer, got {nodes!r}.").format(
            nodes=nodes))
    fields = dict(name=_("{nodes} x 8 H100 SXM").format(nodes=nodes), nodes=nodes,
                  gpus_per_node=8, peak_flops=H100_PEAK_FLOPS, gpu_bytes=H100_BYTES,
                  intra=NVLINK_H100, inter=INFINIBAND_NDR)
    fields.update(changes)
    return Cluster(**fields)


def all_reduce_seconds(n_bytes: float, size: int, link: Link, calls: int = 1) -> float:
    """Lab 06's ring all-reduce of ``n_bytes`` in all, on ``size`` GPUs, in ``calls``
    calls (one latency each)."""
    if size == 1:
        return 0.0
    return calls * link.alpha + 2 * (size - 1) / size * n_bytes / link.beta


def gather_seconds(n_bytes: float, size: int, link: Link, calls: int = 1) -> float:
    """All-gathers (or reduce-scatters) whose full tensors add up to ``n_bytes``."""
    if size == 1:
        return 0.0
    return calls * link.alpha + (size - 1) / size * n_bytes / link.beta


def p2p_seconds(n_bytes: float, link: Link, calls: int = 1) -> float:
    """``calls`` sends to a neighbouring pipeline stage, ``n_bytes`` in all."""
    return calls * link.alpha + n_bytes / link.beta


def bucket_calls(n_bytes: float, bucket_bytes: float = 25 * 2**20) -> int:
    """How many collective calls gradients of ``n_bytes`` take in DDP's buckets
    (``bucket_cap_mb=25``, DDP's default)."""
    return max(1, math.ceil(n_bytes / bucket_bytes))
