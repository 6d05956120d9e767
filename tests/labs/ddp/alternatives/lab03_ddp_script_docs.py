"""Lab 03, exercise 3.4, another idiom: a reader of the docs: torch.accelerator for the
device count, env:// and a timeout spelled out, the environment read once.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

from ddp_worker import Config, train
from labkit.launch import RankContext


def setup_from_env():
    env = {name: int(os.environ[name])
           for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    on_gpus = torch.accelerator.device_count() >= env["LOCAL_WORLD_SIZE"]
    backend = "nccl" if on_gpus else "gloo"
    device = (torch.device("cuda", env["LOCAL_RANK"]) if on_gpus
              else torch.device("cpu"))
    if on_gpus:
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, init_method="env://",
                            rank=env["RANK"], world_size=env["WORLD_SIZE"],
                            timeout=datetime.timedelta(seconds=120))
    return RankContext(env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], backend,
                       device)


if __name__ == "__main__":
    out, epochs, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ctx = setup_from_env()
    weights = train(ctx, Config(epochs=epochs, limit=limit, checkpoint=out + ".ckpt"))
    if ctx.rank == 0:
        torch.save(weights, out)
    dist.destroy_process_group()
