"""Lab 04, exercise 4.2 in a tutorial's style: isend/irecv imported by name, handles
waited on; one function, no forward/backward helpers."""
import torch
from torch.distributed import irecv, isend
from torch.nn import functional as F


def train_step(ctx, stage, images, labels, width):
    rank, world = ctx.rank, ctx.world_size
    inputs = images
    if rank > 0:
        inputs = torch.zeros(images.shape[0], width, device=ctx.device)
        irecv(inputs, src=rank - 1).wait()
        inputs.requires_grad = True
    out = stage(inputs)
    if rank == world - 1:
        out = F.cross_entropy(out, labels)
        out.backward()
    else:
        request = isend(out.detach(), dst=rank + 1)
        grad = torch.zeros_like(out)
        irecv(grad, src=rank + 1).wait()
        request.wait()
        out.backward(gradient=grad)
    if rank > 0:
        isend(inputs.grad, dst=rank - 1).wait()
    return out.item() if rank == world - 1 else None
