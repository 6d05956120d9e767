"""Lab 08, exercise 8.4, another idiom: a DeviceMesh built from its rank array, a
strided (every dp_size-th sample) batch split, and one flat buffer all-reduced for
all gradients at once (DDP's bucket, by hand)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from labkit.labs.tensor_parallel import tensor_parallel as tp


def make_mesh(device_type, world_size, tp_size):
    ranks = torch.arange(world_size).reshape(-1, tp_size)   # rows: nodes
    return DeviceMesh(device_type, ranks, mesh_dim_names=("dp", "tp"))


def my_batch(x, y, mesh):
    dp_mesh = mesh["dp"]
    dp_rank, dp_size = dp_mesh.get_local_rank(), dp_mesh.size()
    return x[dp_rank::dp_size], y[dp_rank::dp_size]


def average_over_dp(model, mesh):
    locals_ = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
               for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in locals_])
    dist.all_reduce(flat, group=mesh["dp"].get_group())
    flat /= mesh["dp"].size()
    offset = 0
    for g in locals_:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def run(ctx, state, x, y, tp_size=2):
    mesh = make_mesh(ctx.device.type, ctx.world_size, tp_size)
    model = tp.MLP(x.shape[-1], state["fc1.weight"].shape[0])
    model.load_state_dict(state)
    parallelize_module(model.to(ctx.device), mesh["tp"],
                       {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    xb, yb = my_batch(x.to(ctx.device), y.to(ctx.device), mesh)
    F.mse_loss(model(xb), yb).backward()
    average_over_dp(model, mesh)
    return {"coordinate": mesh.get_coordinate(),
            "tp_group": dist.get_process_group_ranks(mesh.get_group("tp")),
            "dp_group": dist.get_process_group_ranks(mesh.get_group("dp")),
            "batch": xb.cpu(),
            "grads": tp.full_tensors({n: p.grad for n, p in model.named_parameters()})}
