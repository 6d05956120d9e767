"""Lab 08, exercise 8.2, another idiom: PyTorch's TP tutorial / torchtitan style.

The plan uses parallelize_module's fnmatch keys ("attn.[qkv]"), spells every layout
out (Shard(2) on a (B, T, C) input is the default Shard(-1)), and the head count is
divided the tutorial's way.
"""
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from labkit.labs.tensor_parallel import tensor_parallel as tp


def block_plan():
    return {
        "attn.[qkv]": ColwiseParallel(input_layouts=Replicate(),
                                      output_layouts=Shard(2), use_local_output=True),
        "attn.out": RowwiseParallel(input_layouts=Shard(2),
                                    output_layouts=Replicate()),
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": RowwiseParallel(input_layouts=Shard(2)),
    }


def parallelize(block, mesh):
    block = parallelize_module(module=block, device_mesh=mesh,
                               parallelize_plan=block_plan())
    attn_layer = block.attn
    attn_layer.n_heads = attn_layer.n_heads // mesh.size()
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
