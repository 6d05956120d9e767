"""Lab 07, exercise 7.2, another idiom: a plain all_reduce, ``narrow`` for the slice,
and ``dist.all_gather`` into a list of shards (the list form most examples use).
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from labkit.labs.sharding import sharded


def shard_range(numel, rank, world_size):
    import math
    per_rank = math.ceil(numel / world_size)
    return (rank * per_rank, rank * per_rank + per_rank)


def make_shard_optimizer(model, ctx, lr):
    flat = parameters_to_vector(model.parameters()).detach()
    start, stop = shard_range(flat.numel(), ctx.rank, ctx.world_size)
    shard = torch.zeros(stop - start, device=flat.device)
    mine = flat[start:stop]                       # the last slice may be short
    shard[:mine.numel()] = mine
    shard.requires_grad_(True)
    return shard, torch.optim.Adam([shard], lr=lr)


def zero1_step(model, shard, optimizer, ctx):
    params = list(model.parameters())
    grads = parameters_to_vector([p.grad for p in params])
    numel = grads.numel()
    dist.all_reduce(grads, op=dist.ReduceOp.SUM)
    grads = F.pad(grads / ctx.world_size, (0, shard.numel() * ctx.world_size - numel))
    shard.grad = grads.narrow(0, ctx.rank * shard.numel(), shard.numel()).clone()
    optimizer.step()
    pieces = [torch.empty_like(shard) for _ in range(ctx.world_size)]
    dist.all_gather(pieces, shard.detach())
    vector_to_parameters(torch.cat(pieces)[:numel], params)   # writes .data


def train(ctx, cfg):
    torch.manual_seed(cfg.seed)
    model = sharded.block_mlp(cfg.width, cfg.depth).to(ctx.device)
    shard, optimizer = make_shard_optimizer(model, ctx, cfg.lr)
    for images, labels in sharded.rank_batches(cfg, ctx.rank, ctx.world_size,
                                               ctx.device):
        model.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        zero1_step(model, shard, optimizer, ctx)
    return model, optimizer
