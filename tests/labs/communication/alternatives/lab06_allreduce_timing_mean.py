"""Lab 06, exercise 6.1, another correct idiom: per-call times and their mean, with
``time.monotonic``, async collectives waited for, and a uint8 buffer of n bytes."""
import time

import numpy as np
import torch
import torch.distributed as dist


def time_allreduce(ctx, sizes, iters=10, warmup=3):
    out = {}
    for n in sizes:
        x = torch.ones(n, dtype=torch.uint8, device=ctx.device)
        for _ in range(warmup):
            dist.all_reduce(x, async_op=True).wait()
        dist.barrier()
        per_call = []
        for _ in range(iters):
            t0 = time.monotonic()
            dist.all_reduce(x, op=dist.ReduceOp.SUM, async_op=True).wait()
            if torch.cuda.is_available() and x.is_cuda:
                torch.cuda.synchronize()
            per_call.append(time.monotonic() - t0)
        out[n] = float(np.mean(per_call))
    return out
