"""Lab 05, exercise 5.3 the way PyTorch's Schedule1F1B groups it: p - rank warm-up
forwards, then "one backward, one forward"; run_order with P2POp batches."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def one_f_one_b(rank, num_stages, num_microbatches):
    m = num_microbatches
    forwards = min(num_stages - rank, m)
    order = [("F", i) for i in range(forwards)]
    for i in range(m):
        order.append(("B", i))
        if forwards < m:
            order.append(("F", forwards))
            forwards += 1
    return order


def run_order(ctx, stage, microbatches, order, width):
    rank, world = ctx.rank, ctx.world_size
    m = len(microbatches)
    held, works, loss = {}, [], 0.0
    for kind, i in order:
        x, y = microbatches[i]
        if kind == "F":
            if rank > 0:
                x = torch.empty(len(x), width, device=ctx.device)
                receive = dist.P2POp(dist.irecv, x, rank - 1)
                for work in dist.batch_isend_irecv([receive]):
                    work.wait()
                x.requires_grad_()
            out = stage(x)
            if rank == world - 1:
                out = F.cross_entropy(out, y) / m
                loss += out.item()
            else:
                works += dist.batch_isend_irecv(
                    [dist.P2POp(dist.isend, out.detach(), rank + 1)])
            held[i] = (x, out)
        else:
            x, out = held.pop(i)
            grad = None
            if rank < world - 1:
                grad = torch.empty_like(out)
                receive = dist.P2POp(dist.irecv, grad, rank + 1)
                for work in dist.batch_isend_irecv([receive]):
                    work.wait()
            torch.autograd.backward(out, grad)
            if rank > 0:
                works += dist.batch_isend_irecv(
                    [dist.P2POp(dist.isend, x.grad, rank - 1)])
    for work in works:
        work.wait()
    return loss if rank == world - 1 else None
