"""The model, data and DDP + Adam reference that the sharding lab trains on ranks.

Taught in: lab 07 (ZeRO, FSDP2, activation checkpointing, distributed checkpoints).
``block_mlp`` is a stack of residual blocks, the shape FSDP2 and checkpointing are
applied to (one block = one all-gather, one checkpointed segment). ``ddp_adam`` is
the run every sharded variant must reproduce: DDP, one Adam over every parameter.
"""

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit import data
from labkit.labs.sharding import sharding_memory
from labkit.messages import _

__all__ = ["TrainConfig", "Block", "BlockMLP", "block_mlp", "rank_batches", "ddp_adam",
           "weights", "WEIGHT_TOLERANCE", "quiet_renamed_collectives"]

# How far a sharded variant's weights may be from DDP's after a few Adam steps (lr
# 1e-3, fp32), by where the ranks ran. Adam divides by sqrt(v) + eps (1e-8), so a
# weight whose gradient is near eps moves up to lr * d / (4 eps) per step when the
# gradient changes by d: every rounding difference is amplified. Measured on CPU
# (tests/labs/sharding/test_tolerance.py, width 256, N = 4, 3 steps): another
# summation order of the ranks' gradients (NCCL's ring or tree) moves the weights
# by ~2e-6; each rank's gradients off by 1e-7 (a kernel's rounding) by ~2e-5. A
# sign flip cannot do more: rounding flips only |g| below its own error, far under
# eps, where Adam's step is lr * |g| / eps. So 1e-4 holds on GPUs with fp32
# matmuls, not with TF32 (gradients off by 1e-3 move weights by ~2e-3).
WEIGHT_TOLERANCE = {"cpu": 1e-5, "cuda": 1e-4}



def quiet_renamed_collectives() -> None:
    """Stop torch >= 2.13 from warning on each call of the collectives it renamed.

    torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to *_single
    and warns (FutureWarning) on every call of the old names. The lab's ZeRO workers
    keep the old names, which torch 2.6 has too, and its Pitfalls explain the
    warning; the ranks that import this module (every ZeRO worker does) do not
    repeat it at every step. Any other warning still shows.
    """
    warnings.filterwarnings(
        "ignore", category=FutureWarning,
        message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)"
                r"` is deprecated")


quiet_renamed_collectives()


@dataclass(frozen=True)
class TrainConfig:
    """What a sharded run (or its DDP reference) trains, and how long."""

    steps: int = 4
    global_batch: int = 32    # across all ranks: each gets global_batch / world_size
    lr: float = 1e-3
    width: int = 64
    depth: int = 4            # residual blocks
    seed: int = 0


class Block(nn.Module):
    """x + W2 gelu(W1 layernorm(x)): a transformer's MLP half, (B, d) -> (B, d)."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class BlockMLP(nn.Module):
    """embed (784 -> d), ``depth`` residual blocks, head (d -> 10)."""

    def __init__(self, width: int = 64, depth: int = 4):
        super().__init__()
        self.embed = nn.Linear(28 * 28, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, images):
        x = self.embed(images.flatten(1))          # (B, d)
        for block in self.blocks:
            x = block(x)
        return self.head(x)                        # (B, 10)


def block_mlp(width: int = 64, depth: int = 4) -> BlockMLP:
    """Return a BlockMLP; about 8.3 d**2 parameters per block, 795 d in embed+head."""
    if width < 1 or depth < 1:
        raise ValueError(_("block_mlp needs width >= 1 and depth >= 1, got "
                           "width={width}, depth={depth}.").format(width=width,
                                                                   depth=depth))
    return BlockMLP(width, depth)


def rank_batches(cfg: TrainConfig, rank: int, world_size: int, device="cpu"):
    """Yield this rank's (images, labels) for each of ``cfg.steps`` steps.

    Step j's global batch is the same seeded data on every rank; rank r takes the
    r-th contiguous slice of it, so N ranks together see exactly the global batch.
    """
    if cfg.global_batch % world_size:
        raise ValueError(_("global_batch={global_batch} does not split evenly over "
                           "{world_size} ranks: use a multiple of {world_size}."
                           ).format(global_batch=cfg.global_batch,
                                    world_size=world_size))
    images, labels = data.random_batch(cfg.steps * cfg.global_batch, cfg.seed + 1)
    per_rank = cfg.global_batch // world_size
    for step in range(cfg.steps):
        start = step * cfg.global_batch + rank * per_rank
        yield (images[start:start + per_rank].to(device),
               labels[start:start + per_rank].to(device))


def weights(model: nn.Module) -> dict:
    """Return {name: CPU copy} of a plain (or DDP-wrapped) model's state_dict."""
    model = getattr(model, "module", model)
    return {name: t.detach().cpu().clone() for name, t in model.state_dict().items()}


def ddp_adam(ctx, cfg: TrainConfig) -> dict:
    """Rank worker: train block_mlp with DDP and Adam; return weights and bytes held.

    The bytes (``sharding_memory.state_bytes``) are measured after the last step,
    before any zero_grad: parameters, gradients and Adam's two states, all whole.
    """
    torch.manual_seed(cfg.seed)
    model = block_mlp(cfg.width, cfg.depth).to(ctx.device)
    model = DDP(model, device_ids=[ctx.device] if ctx.device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    for images, labels in rank_batches(cfg, ctx.rank, ctx.world_size, ctx.device):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()   # gradients all-reduced
        optimizer.step()
    return {"weights": weights(model),
            "bytes": sharding_memory.state_bytes(model, optimizer)}
