"""Lab 08, exercise 8.1, another idiom: Megatron-LM's mappings.

Megatron-LM (megatron/core/tensor_parallel/mappings.py) all-reduces IN PLACE inside
the autograd functions (``_reduce``), and its layers slice the full weight with
``torch.chunk``; each shard here is kept inside an ``nn.Linear`` (parameters named
``fc1.linear.weight``), as a reader of the nn docs might.
"""
import torch
import torch.distributed as dist
from torch import nn

from labkit.labs.tensor_parallel import tensor_parallel as tp


def _reduce(tensor):
    """Megatron's _reduce: all-reduce in place and return the same tensor."""
    if dist.get_world_size() == 1:
        return tensor
    dist.all_reduce(tensor)
    return tensor


class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return _reduce(grad.contiguous().clone())


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        return _reduce(partial)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Module):
    def __init__(self, full, rank, world_size):
        super().__init__()
        tp.check_divisible(full.out_features, world_size, "out_features")
        self.linear = nn.Linear(full.in_features, full.out_features // world_size)
        with torch.no_grad():
            self.linear.weight.copy_(torch.chunk(full.weight, world_size, dim=0)[rank])
            self.linear.bias.copy_(torch.chunk(full.bias, world_size, dim=0)[rank])

    def forward(self, x):
        return self.linear(CopyToParallel.apply(x))


class RowParallelLinear(nn.Module):
    def __init__(self, full, rank, world_size):
        super().__init__()
        tp.check_divisible(full.in_features, world_size, "in_features")
        self.linear = nn.Linear(full.in_features // world_size, full.out_features,
                                bias=False)
        self.bias = nn.Parameter(torch.empty(full.out_features))
        with torch.no_grad():
            self.linear.weight.copy_(torch.chunk(full.weight, world_size, dim=1)[rank])
            self.bias.copy_(full.bias)

    def forward(self, h):
        return ReduceFromParallel.apply(self.linear(h)) + self.bias


class ParallelMLP(nn.Module):
    def __init__(self, mlp, rank, world_size):
        super().__init__()
        self.fc1 = ColumnParallelLinear(mlp.fc1, rank, world_size)
        self.act = nn.GELU()
        self.fc2 = RowParallelLinear(mlp.fc2, rank, world_size)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def run(ctx, state, x):
    mlp = tp.MLP(x.shape[-1], state["fc1.weight"].shape[0])
    mlp.load_state_dict(state)
    model = ParallelMLP(mlp, ctx.rank, ctx.world_size).to(ctx.device)
    x = x.to(ctx.device).requires_grad_()
    out = model(x)
    (out * tp.probe(out.shape).to(ctx.device)).sum().backward()
    return {"out": out.detach().cpu(), "x_grad": x.grad.cpu(),
            "grads": {name: p.grad.cpu() for name, p in model.named_parameters()}}
