"""Lab 10, exercise 10.7, another idiom: the norm from torch's own per-tensor norms,
and ZeRO-1 over contiguous runs of parameters, each owner's run sent back as one
flat buffer (torch's flatten helpers), as DeepSpeed's stage 1 does.
"""
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from labkit.labs.capstone import gpt, reference


def global_grad_norm(stage, groups, cfg):
    shapes = dict((n, p.shape) for n, p in gpt.GPT(cfg.model).named_parameters())
    tp_size = dist.get_world_size(groups["tp"])
    squares = torch.zeros(2, dtype=torch.float64)   # [split shards, whole tensors]
    for name, param in stage.named_parameters():
        if name == "wte.weight" and not stage.first:
            continue
        norm = torch.linalg.vector_norm(param.grad, dtype=torch.float64)
        squares[int(param.shape == shapes[name])] += norm ** 2
    split = squares[0].clone()
    dist.all_reduce(split, group=groups["tp"])
    total = split + squares[1]
    dist.all_reduce(total, group=groups["pp"])
    return float(total) ** 0.5


class ShardedOptimizer:
    def __init__(self, params, groups, cfg, stage):
        self.params, self.groups, self.cfg, self.stage = list(params), groups, cfg, stage
        size = dist.get_world_size(groups["dp"])
        total = sum(p.numel() for p in self.params)
        self.runs, run, filled = [[] for _ in range(size)], 0, 0
        for param in self.params:              # contiguous runs of about total / size
            if filled >= (run + 1) * total / size and run < size - 1:
                run += 1
            self.runs[run].append(param)
            filled += param.numel()
        self.me = dist.get_rank(groups["dp"])
        self.inner = reference.make_optimizer(self.runs[self.me], cfg)

    def zero_grad(self, set_to_none=True):
        for param in self.params:
            param.grad = None

    def step(self):
        norm = global_grad_norm(self.stage, self.groups, self.cfg)
        coef = min(1.0, self.cfg.max_norm / (norm + 1e-6))
        torch._foreach_mul_([p.grad for p in self.params], coef)
        self.inner.step()
        for owner, run in enumerate(self.runs):
            if not run:
                continue
            flat = _flatten_dense_tensors([p.data for p in run])
            dist.broadcast(flat, group=self.groups["dp"], group_src=owner)
            for param, value in zip(run, _unflatten_dense_tensors(flat, run)):
                param.data.copy_(value)
