"""Lab 03, exercise 3.2, another idiom: a reader of the torch.distributed docs.
ReduceOp.AVG (gloo has it too in recent releases), asynchronous all-reduces waited
for together, ``from torch.distributed import ...``.
"""
import torch
import torch.nn.functional as F
from torch.distributed import ReduceOp, all_reduce

from labkit import data, models


def my_share(images, labels, rank, world_size):
    return images[rank::world_size].clone(), labels[rank::world_size].clone()


def average_gradients(model):
    works = [all_reduce(p.grad, op=ReduceOp.AVG, async_op=True)
             for p in model.parameters()]
    for work in works:
        work.wait()


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
