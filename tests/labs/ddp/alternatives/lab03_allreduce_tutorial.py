"""Lab 03, exercise 3.2, another idiom: PyTorch's "Writing Distributed Applications"
tutorial (``param.grad.data``, a float world size) and an index tensor for the share.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit import data, models


def my_share(images, labels, rank, world_size):
    index = torch.arange(rank, images.shape[0], world_size)
    return images[index], labels[index]


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def train(ctx, steps=8, global_batch=32, lr=0.05, seed=0):
    torch.manual_seed(seed)
    model = models.small_cnn().to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    images, labels = data.random_batch(steps * global_batch, seed + 1, ctx.device)
    for step in range(steps):
        batch = slice(step * global_batch, (step + 1) * global_batch)
        x, y = my_share(images[batch], labels[batch], ctx.rank, ctx.world_size)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        average_gradients(model)
        optimizer.step()
    return {name: p.detach().cpu() for name, p in model.named_parameters()}
