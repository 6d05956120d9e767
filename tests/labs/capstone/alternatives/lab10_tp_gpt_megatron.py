"""Lab 10, exercise 10.1 in Megatron-LM's idiom: the mappings as functions
(copy_to / reduce_from the tensor-parallel region), Column/RowParallelLinear modules
holding their shards as parameters, attention written out (masked softmax)."""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tensor_model_parallel_region(x, group):
    return _Copy.apply(x, group)


def reduce_from_tensor_model_parallel_region(x, group):
    return _Reduce.apply(x, group)


class ColumnParallelLinear(nn.Module):
    def __init__(self, full, group):
        super().__init__()
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        weights = full.weight.detach().chunk(size, dim=0)
        biases = full.bias.detach().chunk(size, dim=0)
        self.weight = nn.Parameter(weights[rank].clone())
        self.bias = nn.Parameter(biases[rank].clone())

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, full, group):
        super().__init__()
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.group = group
        self.weight = nn.Parameter(full.weight.detach().chunk(size, dim=1)[rank].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        partial = x @ self.weight.t()
        return reduce_from_tensor_model_parallel_region(partial, self.group) + self.bias


class ParallelAttention(nn.Module):
    def __init__(self, attn, group):
        super().__init__()
        self.group = group
        self.heads = attn.num_heads // dist.get_world_size(group)
        self.head_dim = attn.head_dim
        self.q, self.k, self.v = (ColumnParallelLinear(p, group)
                                  for p in (attn.q, attn.k, attn.v))
        self.out = RowParallelLinear(attn.out, group)

    def forward(self, x):
        b, t, _ = x.shape
        x = copy_to_tensor_model_parallel_region(x, self.group)
        q, k, v = (p(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
        return self.out(y)


class ParallelMLP(nn.Module):
    def __init__(self, mlp, group):
        super().__init__()
        self.group = group
        self.fc1 = ColumnParallelLinear(mlp.fc1, group)
        self.fc2 = RowParallelLinear(mlp.fc2, group)

    def forward(self, x):
        x = copy_to_tensor_model_parallel_region(x, self.group)
        return self.fc2(F.gelu(self.fc1(x)))


def parallelize_block(block, group):
    block.attn = ParallelAttention(block.attn, group)
    block.mlp = ParallelMLP(block.mlp, group)
