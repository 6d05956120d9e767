"""Lab 03, exercise 3.3, another idiom: pytorch/examples' DDP series (multigpu_torchrun).

A snapshot dict {"MODEL_STATE": ..., "EPOCHS_RUN": ...} saved with
``torch.save``, loaded with ``map_location`` and read back by key; the sampler from
``torch.utils.data.distributed``; ``torch.distributed.barrier()`` spelled in full.
"""
from dataclasses import dataclass

import torch
import torch.distributed
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

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
    if device.type == "cuda":
        return DistributedDataParallel(model.to(device), device_ids=[device.index])
    return DistributedDataParallel(model.to(device))


def make_loader(dataset, batch_per_rank, seed):
    sampler = DistributedSampler(dataset, seed=seed)
    loader = DataLoader(dataset, batch_size=batch_per_rank, pin_memory=False,
                        shuffle=False, sampler=sampler)
    return loader, sampler


def save_and_load(ctx, model, path):
    if ctx.rank == 0:
        snapshot = {"MODEL_STATE": model.module.state_dict(), "EPOCHS_RUN": 2}
        torch.save(snapshot, path)
        print(f"Training snapshot saved at {path}")
    torch.distributed.barrier()
    snapshot = torch.load(path, map_location=ctx.device, weights_only=True)
    state = snapshot["MODEL_STATE"]
    return {name: tensor.cpu() for name, tensor in state.items()}


def _run_batch(model, optimizer, source, targets):
    optimizer.zero_grad()
    output = model(source)
    loss = F.cross_entropy(output, targets)
    loss.backward()
    optimizer.step()


def train(ctx, cfg):
    split = data.DeviceData.mnist(train=True, limit=cfg.limit)
    dataset = TensorDataset(split.images, split.labels)
    torch.manual_seed(cfg.seed)
    model = wrap(models.small_cnn(), ctx.device)
    loader, sampler = make_loader(dataset, cfg.batch_per_rank, cfg.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    for epoch in range(cfg.epochs):
        loader.sampler.set_epoch(epoch)
        for source, targets in loader:
            _run_batch(model, optimizer, source.to(ctx.device), targets.to(ctx.device))
    return save_and_load(ctx, model, cfg.checkpoint)
