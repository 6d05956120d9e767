"""Lab 07, exercise 7.2, another idiom: reduce-scatter the gradients, all-gather the
shards, under torch's newer names when they exist (a docs reader's ZeRO-1).

The gradients are never whole after the step: each rank gets only its slice, summed.
The master shard is an ``nn.Parameter``; the model is unflattened by hand.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.labs.sharding import sharded


def shard_range(numel, rank, world_size):
    size = (numel + world_size - 1) // world_size
    return rank * size, (rank + 1) * size


def _padded(tensors, world_size):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    total = shard_range(flat.numel(), world_size - 1, world_size)[1]
    return torch.cat([flat, flat.new_zeros(total - flat.numel())])


def make_shard_optimizer(model, ctx, lr):
    params = list(model.parameters())
    flat = _padded([p.detach() for p in params], ctx.world_size)
    start, stop = shard_range(sum(p.numel() for p in params), ctx.rank, ctx.world_size)
    master = torch.nn.Parameter(flat[start:stop].clone())
    return master, torch.optim.Adam([master], lr=lr)


def zero1_step(model, shard, optimizer, ctx):
    params = list(model.parameters())
    grads = _padded([p.grad for p in params], ctx.world_size)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or \
        dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    shard.grad = torch.empty_like(shard)
    reduce_scatter(shard.grad, grads, op=dist.ReduceOp.SUM)
    shard.grad.div_(ctx.world_size)
    optimizer.step()
    full = torch.empty_like(grads)
    all_gather(full, shard.data)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def train(ctx, cfg):
    torch.manual_seed(cfg.seed)
    model = sharded.block_mlp(cfg.width, cfg.depth).to(ctx.device)
    shard, optimizer = make_shard_optimizer(model, ctx, cfg.lr)
    for images, labels in sharded.rank_batches(cfg, ctx.rank, ctx.world_size,
                                               ctx.device):
        for p in model.parameters():
            p.grad = None
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        zero1_step(model, shard, optimizer, ctx)
    return model, optimizer
