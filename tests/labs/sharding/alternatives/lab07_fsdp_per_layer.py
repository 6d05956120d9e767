"""Lab 07, exercise 7.3, finer groups: ``fully_shard`` on every Linear inside the
blocks (the LayerNorms join the root's group), then the root, on a mesh named
by the device type; bytes counted from ``DTensor.to_local()``.
"""
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from labkit.labs.sharding import sharded


def shard_model(model, mesh):
    for block in model.blocks:
        for layer in block.modules():
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def local_bytes(model, optimizer):
    def nbytes(t):
        local = t.to_local() if isinstance(t, DTensor) else t
        return local.numel() * local.element_size()

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    moments = [state[k] for state in optimizer.state.values()
               for k in ("exp_avg", "exp_avg_sq")]
    return {"parameters": sum(nbytes(p) for p in model.parameters()),
            "gradients": sum(nbytes(g) for g in grads),
            "optimizer states": sum(nbytes(m) for m in moments)}


def train(ctx, cfg):
    mesh = init_device_mesh("cpu" if ctx.device.type == "cpu" else "cuda",
                            (ctx.world_size,))
    torch.manual_seed(cfg.seed)
    model = shard_model(sharded.block_mlp(cfg.width, cfg.depth).to(ctx.device), mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    for images, labels in sharded.rank_batches(cfg, ctx.rank, ctx.world_size,
                                               ctx.device):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
    return model, optimizer
