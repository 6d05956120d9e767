"""Lab 04, exercise 4.4 another way: torch.inference_mode, isend/irecv with waits,
the answer received with a P2POp batch; keyword arguments throughout."""
import torch
import torch.distributed as dist


@torch.inference_mode()
def serve(ctx, stage, request, width):
    rank, last = ctx.rank, ctx.world_size - 1
    if rank == 0:
        hidden = stage(request)
        dist.isend(tensor=hidden, dst=1).wait()
        logits = torch.zeros(request.shape[0], 10, device=ctx.device)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, logits, last)]):
            work.wait()
        return logits
    hidden = torch.zeros(request.shape[0], width, device=ctx.device)
    dist.irecv(tensor=hidden, src=rank - 1).wait()
    out = stage(hidden)
    dist.isend(tensor=out, dst=0 if rank == last else rank + 1).wait()
    return None
