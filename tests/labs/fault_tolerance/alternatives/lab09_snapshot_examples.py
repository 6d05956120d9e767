"""Lab 09, exercise 9.1, another idiom: pytorch/examples' ddp-tutorial-series.

pytorch/examples (distributed/ddp-tutorial-series/multigpu_torchrun.py) keeps a
snapshot dict with upper-case keys ("MODEL_STATE", "EPOCHS_RUN") written by
``_save_snapshot`` and read by ``_load_snapshot``; here with the optimizer and every
rank's RNG state added, ``from torch import save``, a mkstemp temporary file (and
an fsync of the folder), the RNG states gathered on rank 0 only (``gather_object``),
and the batches from a DataLoader over the sampler (with its own generator, so that
it leaves torch's global RNG alone).
"""
import os
import tempfile

import torch
import torch.distributed as dist
from torch import load, save
from torch.utils.data import DistributedSampler

from labkit.labs.fault_tolerance import snapshots


def save_atomic(obj, path):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _save_snapshot(path, model, optimizer, epochs_run):
    rng = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(torch.get_rng_state(), rng, dst=0)
    if dist.get_rank() == 0:
        snapshot = {"MODEL_STATE": model.state_dict(),
                    "OPTIMIZER_STATE": optimizer.state_dict(),
                    "EPOCHS_RUN": epochs_run, "RNG_STATES": rng}
        save_atomic(snapshot, path)
        print(f"Training snapshot saved at {path}")
    dist.barrier()


def _load_snapshot(path, model, optimizer):
    snapshot = load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(snapshot["MODEL_STATE"])
    optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
    torch.set_rng_state(snapshot["RNG_STATES"][dist.get_rank()])
    return snapshot["EPOCHS_RUN"]


save_snapshot, load_snapshot = _save_snapshot, _load_snapshot


def batches(cfg, rank, world_size, start_step):
    per_epoch = snapshots.steps_per_epoch(cfg, world_size)
    step = start_step
    while True:
        epoch, i = divmod(step, per_epoch)
        sampler = DistributedSampler(range(cfg.samples), num_replicas=world_size,
                                     rank=rank, shuffle=True, seed=cfg.seed,
                                     drop_last=True)
        sampler.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(   # its own generator: a DataLoader
            range(cfg.samples), sampler=sampler,  # iterator draws a seed from it,
            batch_size=cfg.batch_per_rank,        # never from torch's global RNG
            generator=torch.Generator().manual_seed(cfg.seed))
        for j, index in enumerate(loader):
            if j >= i:
                yield index
                step += 1
