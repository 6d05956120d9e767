"""Lab 09, exercise 9.2, another idiom: pathlib, the step parsed from the name.

The newest snapshot is the one with the highest step number (not the last name in
sorted order), torn ``.tmp`` files are skipped by their suffix, and the save path is
built with pathlib.
"""
import faulthandler
import os
import re
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from labkit import launch
from labkit.labs.fault_tolerance import elastic, snapshots
from snapshot import batches, load_snapshot, save_snapshot   # exercise 9.1

NAME = re.compile(r"step_(\d+)\.pt")


def latest_snapshot(folder):
    found = [(int(m.group(1)), p) for p in Path(folder).iterdir()
             if (m := NAME.fullmatch(p.name))]
    return str(max(found)[1]) if found else None


def train(ctx, cfg, folder):
    model, optimizer = snapshots.build(cfg)
    images, labels = snapshots.dataset(cfg)
    latest = latest_snapshot(folder)
    step = 0 if latest is None else load_snapshot(latest, model.module, optimizer)
    elastic.record_start(folder, ctx, step)
    for index in batches(cfg, ctx.rank, ctx.world_size, step):
        if step == cfg.steps:
            break
        snapshots.train_step(model, optimizer, images[index], labels[index])
        step += 1
        if step % cfg.every == 0:
            save_snapshot(str(Path(folder) / f"step_{step:06d}.pt"), model.module,
                          optimizer, step)
        elastic.pause_if_asked(folder, ctx, step)
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}


if __name__ == "__main__":
    folder, steps = sys.argv[1], int(sys.argv[2])
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    ctx = launch.init_from_env(backend="gloo", threads_per_rank=1, timeout=30)
    weights = train(ctx, snapshots.Config(steps=steps), folder)
    if ctx.rank == 0:
        torch.save(weights, os.path.join(folder, "final.pt"))
    dist.destroy_process_group()
