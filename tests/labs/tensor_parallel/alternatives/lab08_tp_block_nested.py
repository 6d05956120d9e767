"""Lab 08, exercise 8.2, another idiom: one plan per submodule, applied to each.

A reader of the parallelize_module docs may split the attention and the MLP
separately (parallelize_module on block.attn and on block.mlp), with short keys.
"""
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from labkit.labs.tensor_parallel import tensor_parallel as tp

ATTENTION = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
             "out": RowwiseParallel()}
MLP = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def block_plan():
    plan = {f"attn.{name}": style for name, style in ATTENTION.items()}
    plan.update({f"mlp.{name}": style for name, style in MLP.items()})
    return plan


def parallelize(block, mesh):
    parallelize_module(block.attn, mesh, ATTENTION)
    parallelize_module(block.mlp, mesh, MLP)
    block.attn.n_heads = block.attn.n_heads // mesh.size()
    return block


def run(ctx, state, x, n_heads):
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    block = tp.Block(x.shape[-1], n_heads)
    block.load_state_dict(state)
    block = parallelize(block.to(ctx.device), mesh)
    x = x.to(ctx.device).requires_grad_()
    out = block(x)
    (out * tp.probe(out.shape).to(ctx.device)).sum().backward()
    grads = tp.full_tensors({name: p.grad for name, p in block.named_parameters()})
    placements = {name: str(getattr(p, "placements", "whole"))
                  for name, p in block.named_parameters()}
    return {"out": out.detach().cpu(), "x_grad": x.grad.cpu(), "grads": grads,
            "placements": placements, "n_heads": block.attn.n_heads}
