"""Lab 09, exercise 9.1, another idiom: torch.distributed.checkpoint (DCP).

Model and optimizer go through DCP (every rank calls dcp.save / dcp.load; the state
dicts come from torch.distributed.checkpoint.state_dict), the step and the RNG states
in a small torch.save'd file next to it (DCP is for tensors that ranks share).
save_atomic stays the torch.save of the exercise: it writes that small file.
"""
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.utils.data import DistributedSampler

from labkit.labs.fault_tolerance import snapshots


def save_atomic(obj, path):
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_snapshot(path, model, optimizer, step):
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state},
             checkpoint_id=f"{path}.dcp")
    rng = [None] * dist.get_world_size()
    dist.all_gather_object(rng, torch.get_rng_state())
    if dist.get_rank() == 0:
        save_atomic({"step": step, "rng": rng}, path)   # last: the snapshot is whole
    dist.barrier()


def load_snapshot(path, model, optimizer):
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=f"{path}.dcp")
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    meta = torch.load(path, weights_only=True)
    torch.set_rng_state(meta["rng"][dist.get_rank()])
    return meta["step"]


def batches(cfg, rank, world_size, start_step):
    per_epoch = snapshots.steps_per_epoch(cfg, world_size)
    for step in range(start_step, 10**9):
        epoch, i = divmod(step, per_epoch)
        sampler = DistributedSampler(range(cfg.samples), num_replicas=world_size,
                                     rank=rank, shuffle=True, seed=cfg.seed,
                                     drop_last=True)
        sampler.set_epoch(epoch)
        order = list(sampler)
        yield torch.tensor(order[i * cfg.batch_per_rank:(i + 1) * cfg.batch_per_rank])
