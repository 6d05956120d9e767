"""Where the training bytes go, per rank: ZeRO's stages, measured state, does it fit.

Taught in: lab 07 (ZeRO and FSDP2). ``zero_bytes_per_rank`` is the reference answer of
the per-stage formula exercise; ``state_bytes`` measures what one rank really holds
(local shards of DTensors); ``per_gpu_bytes`` and ``transformer_activation_bytes``
extend lab 00's "does it fit?" calculator with the stage, N and checkpointing.
Memory is in bytes here; the lab prints GiB (2**30 bytes).
"""

import torch
from torch.distributed.tensor import DTensor

from labkit.messages import N_, _

__all__ = ["KINDS", "kind_name", "STAGES", "zero_bytes_per_rank", "state_bytes",
           "per_gpu_bytes", "transformer_activation_bytes", "MODEL_SHAPES",
           "H200_TORCH_GIB"]

KINDS = ("parameters", "gradients", "optimizer states")
_KIND_NAMES = {"parameters": N_("parameters"), "gradients": N_("gradients"),
               "optimizer states": N_("optimizer states")}   # KINDS, as said


def kind_name(kind: str) -> str:
    """One of KINDS as the learner reads it (a legend, a hint), in their language;
    the keys themselves stay English (the exercises return them)."""
    return _(_KIND_NAMES[kind]) if kind in _KIND_NAMES else kind
# Shown in the learner's language where they are used: _(STAGES[stage]).
STAGES = {0: N_("DDP: nothing sharded"), 1: N_("ZeRO-1: optimizer states sharded"),
          2: N_("ZeRO-2: + gradients sharded"),
          3: N_("ZeRO-3 / FSDP: + parameters sharded")}

# What torch.cuda.get_device_properties(0).total_memory reports on an H200 (about
# 139 GiB; nvidia-smi shows about 140 GiB; not measured in this course yet); NVIDIA's
# data sheet says "141 GB". Leave 10-20 % of it for the CUDA context, NCCL buffers and
# fragmentation.
H200_TORCH_GIB = 139.0

# (parameters, layers, hidden size, attention heads) of well-known transformers.
MODEL_SHAPES = {
    "GPT-2 XL (1.5 B)": (1.56e9, 48, 1600, 25),
    "Llama 2 7B": (6.74e9, 32, 4096, 32),
    "Pythia 12B": (11.8e9, 36, 5120, 40),
    "Llama 2 13B": (13.0e9, 40, 5120, 40),
    "Llama 2 70B": (69.0e9, 80, 8192, 64),
    "GPT-3 175B": (175e9, 96, 12288, 96),
}


def _check(num_params, world_size, stage) -> None:
    if stage not in STAGES:
        raise ValueError(_("ZeRO stage must be one of {stages}, got {stage!r}.").format(
            stages=sorted(STAGES), stage=stage))
    if type(world_size) is not int or world_size < 1:   # bool, float: refused
        raise ValueError(_("world_size must be an int >= 1, got {world_size!r}."
                           ).format(world_size=world_size))
    if num_params < 0:
        raise ValueError(_("num_params must be >= 0, got {num_params}.").format(
            num_params=num_params))


def zero_bytes_per_rank(num_params, world_size: int, stage: int, param_bytes=2,
                        grad_bytes=2, optimizer_bytes=12) -> dict:
    """Return {kind: bytes} one rank holds under ZeRO ``stage`` (0 = DDP) on N ranks.

    Defaults are mixed-precision Adam (ZeRO paper, K = 12): 16-bit parameters and
    gradients, and an fp32 master copy plus Adam's two moments. Stage s shards the
    first s kinds of (optimizer states, gradients, parameters) over the N ranks.
    """
    _check(num_params, world_size, stage)
    n = world_size
    return {"parameters": num_params * param_bytes / (n if stage >= 3 else 1),
            "gradients": num_params * grad_bytes / (n if stage >= 2 else 1),
            "optimizer states": num_params * optimizer_bytes / (n if stage >= 1 else 1)}


def _local(tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (its numel() is the global size), else itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _nbytes(tensors) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors)


def state_bytes(model, optimizer=None) -> dict:
    """Return {kind: bytes} this rank holds now: local parameters, gradients, states.

    Works for plain, DDP and FSDP2 models (DTensor parameters count their local
    shard). Tensors the optimizer steps that are not the model's own (the fp32
    master shard of a from-scratch ZeRO) count as optimizer states, and their
    gradients as gradients. ZeroRedundancyOptimizer's local optimizer is ``.optim``.
    """
    params = list(model.parameters())
    own = {id(p) for p in params}
    optimizer = getattr(optimizer, "optim", optimizer)
    masters, states = [], []
    if optimizer is not None:
        masters = [p for group in optimizer.param_groups for p in group["params"]
                   if id(p) not in own]
        states = [v for state in optimizer.state.values() for v in state.values()
                  if torch.is_tensor(v) and v.dim() > 0]   # not Adam's step counter
    grads = [p.grad for p in params + masters if p.grad is not None]
    return {"parameters": _nbytes(params), "gradients": _nbytes(grads),
            "optimizer states": _nbytes(states + masters)}


def transformer_activation_bytes(layers: int, hidden: int, heads: int, seq_len: int,
                                 micro_batch: int, checkpointing=False) -> float:
    """Return the activation bytes of one micro-batch (16-bit, no tensor parallelism).

    Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes per layer. With full
    checkpointing each layer keeps only its input (2*s*b*h), and backward rebuilds
    one layer's activations at a time.
    """
    if min(layers, hidden, heads, seq_len, micro_batch) < 1:
        raise ValueError(_("layers, hidden, heads, seq_len and micro_batch must all be "
                           ">= 1, got {layers}, {hidden}, {heads}, {seq_len}, "
                           "{micro_batch}.").format(layers=layers, hidden=hidden,
                                                    heads=heads, seq_len=seq_len,
                                                    micro_batch=micro_batch))
    s, b, h, a = seq_len, micro_batch, hidden, heads
    per_layer = s * b * h * (34 + 5 * a * s / h)
    if checkpointing:
        return layers * 2 * s * b * h + per_layer
    return layers * per_layer


def per_gpu_bytes(num_params, world_size: int = 1, stage: int = 0,
                  activation_bytes: float = 0, **widths) -> float:
    """Return lab 00's "does it fit?" sum for one GPU under ZeRO ``stage`` on N GPUs.

    Model states from ``zero_bytes_per_rank`` (``widths``: param_bytes, grad_bytes,
    optimizer_bytes) plus the activations of this GPU's micro-batch.
    """
    return sum(zero_bytes_per_rank(num_params, world_size, stage, **widths).values()) \
        + activation_bytes
