"""Lab 03, exercise 3.4, another idiom: PyTorch's DDP tutorial ("Initialize DDP with
torch.distributed.run/torchrun"): init_process_group with the backend alone, then rank
and world size asked from the process group; one backend for the whole job.
"""
import os
import sys

import torch
import torch.distributed as dist

from ddp_worker import Config, train
from labkit.launch import RankContext


def setup_from_env():
    use_gpu = (torch.cuda.is_available()
               and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]))
    dist.init_process_group("nccl" if use_gpu else "gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}") if use_gpu else torch.device("cpu")
    if use_gpu:
        torch.cuda.set_device(device)
    return RankContext(rank, dist.get_world_size(), local_rank, dist.get_backend(),
                       device)


if __name__ == "__main__":
    out, epochs, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ctx = setup_from_env()
    weights = train(ctx, Config(epochs=epochs, limit=limit, checkpoint=out + ".ckpt"))
    if ctx.rank == 0:
        torch.save(weights, out)
    dist.destroy_process_group()
