"""Lab 03, exercise 3.4, another idiom: pytorch/examples' multigpu_torchrun.py
(``ddp_setup``: ``from torch.distributed import init_process_group``, set_device
first, ``backend=`` by keyword), with the job-wide CPU fallback and device_id.
"""
import os
import sys

import torch
from torch.distributed import destroy_process_group, init_process_group

from ddp_worker import Config, train
from labkit.launch import RankContext


def ddp_setup():
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        init_process_group(backend="nccl", device_id=device)
        return "nccl", device
    init_process_group(backend="gloo")
    return "gloo", torch.device("cpu")


def setup_from_env():
    backend, device = ddp_setup()
    return RankContext(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                       int(os.environ["LOCAL_RANK"]), backend, device)


if __name__ == "__main__":
    out, epochs, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ctx = setup_from_env()
    weights = train(ctx, Config(epochs=epochs, limit=limit, checkpoint=out + ".ckpt"))
    if ctx.rank == 0:
        torch.save(weights, out)
    destroy_process_group()
