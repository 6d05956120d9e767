"""Lab 03, exercise 3.3, another idiom: a reader of the API docs.

``torch.serialization.save`` and ``torch.serialization.load`` with map_location
passed by position, ``from torch.distributed import barrier``, a pathlib path, and the
weights loaded back into the model before they are returned.
"""
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.serialization
from torch.distributed import barrier, get_rank
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
    return DDP(model.to(device), device_ids=None if device.type == "cpu" else [device])


def make_loader(dataset, batch_per_rank, seed):
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=False)
    return DataLoader(dataset, batch_per_rank, sampler=sampler, num_workers=0), sampler


def save_and_load(ctx, model, path):
    path = Path(path)
    if get_rank() == 0:
        torch.serialization.save(model.module.state_dict(), path)
    barrier()
    model.module.load_state_dict(torch.serialization.load(path, ctx.device,
                                                          weights_only=True))
    state = model.module.state_dict()
    return {name: tensor.cpu() for name, tensor in state.items()}


def train(ctx, cfg):
    split = data.DeviceData.mnist(train=True, limit=cfg.limit)
    dataset = TensorDataset(split.images, split.labels)
    torch.manual_seed(cfg.seed)
    model = wrap(models.small_cnn(), ctx.device)
    loader, sampler = make_loader(dataset, cfg.batch_per_rank, cfg.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            images = images.to(ctx.device, non_blocking=True)
            labels = labels.to(ctx.device, non_blocking=True)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return save_and_load(ctx, model, cfg.checkpoint)
