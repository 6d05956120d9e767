"""Lab 03, exercise 3.3, another idiom: PyTorch's DDP tutorial (demo_checkpoint).

It saves ``ddp_model.state_dict()`` (keys with the ``module.`` prefix), imports
``from torch import save, load``, loads with the tutorial's map_location dict into the
DDP model, and reads rank and world size from the process group.
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch import load, save
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from labkit import data, models


@dataclass
class Config:
    epochs: int = 2
    batch_per_rank: int = 32
    lr: float = 0.05
    seed: int = 0
    limit: int = 1024
    checkpoint: str = "ddp_checkpoint.pt"


def wrap(model, device):
    model = model.to(device)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    return ddp_model


def make_loader(dataset, batch_per_rank, seed):
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(),
                                 rank=dist.get_rank(), shuffle=True, seed=seed)
    loader = DataLoader(dataset, batch_size=batch_per_rank, shuffle=False,
                        sampler=sampler)
    return loader, sampler


def save_and_load(ctx, model, path):
    CHECKPOINT_PATH = path
    if dist.get_rank() == 0:
        # All processes have the same parameters: saving them in one is enough.
        save(model.state_dict(), CHECKPOINT_PATH)
    dist.barrier()   # process 1 loads only after process 0 has saved
    map_location = {"cuda:%d" % 0: str(ctx.device)}
    model.load_state_dict(load(CHECKPOINT_PATH, map_location=map_location,
                               weights_only=True))
    state = model.state_dict()
    return {name: tensor.cpu() for name, tensor in state.items()}


def train(ctx, cfg):
    split = data.DeviceData.mnist(train=True, limit=cfg.limit)
    dataset = TensorDataset(split.images, split.labels)
    torch.manual_seed(cfg.seed)
    ddp_model = wrap(models.small_cnn(), ctx.device)
    loader, sampler = make_loader(dataset, cfg.batch_per_rank, cfg.seed)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=cfg.lr)
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            outputs = ddp_model(inputs.to(ctx.device))
            loss_fn(outputs, targets.to(ctx.device)).backward()
            optimizer.step()
    return save_and_load(ctx, ddp_model, cfg.checkpoint)
