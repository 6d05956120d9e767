"""Lab 07, exercise 7.3, in torchtitan's idiom: a named 1-D mesh, ``fully_shard`` per
block with the last block kept unsharded after forward (its backward comes first),
then the root; ``local_bytes`` through ``Tensor.nbytes`` of the local shards, Adam's
step counters included.
"""
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from labkit.labs.sharding import sharded


def shard_model(model, mesh):
    last = len(model.blocks) - 1
    for layer_id, block in enumerate(model.blocks):
        fully_shard(block, mesh=mesh, reshard_after_forward=layer_id < last)
    fully_shard(model, mesh=mesh)
    return model


def local_bytes(model, optimizer):
    def size(t):
        return (t.to_local() if hasattr(t, "to_local") else t).nbytes

    params = list(model.parameters())
    return {"parameters": sum(size(p) for p in params),
            "gradients": sum(size(p.grad) for p in params if p.grad is not None),
            "optimizer states": sum(size(v) for state in optimizer.state.values()
                                    for v in state.values() if torch.is_tensor(v))}


def train(ctx, cfg):
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,),
                            mesh_dim_names=("dp_shard",))
    torch.manual_seed(cfg.seed)
    model = shard_model(sharded.block_mlp(cfg.width, cfg.depth), mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    for images, labels in sharded.rank_batches(cfg, ctx.rank, ctx.world_size,
                                               ctx.device):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    return model, optimizer
