"""Train small_cnn with DistributedDataParallel on every rank torchrun starts.

Taught in: lab 03 (torchrun, multi-node). One GPU per rank with NCCL when the node has
enough GPUs, else CPU ranks with gloo; rank 0 prints. Run from the course folder:

    torchrun --standalone --nproc-per-node=2 env/slurm/train_ddp.py --steps 20
    sbatch env/slurm/ddp.sbatch                     # 2 nodes x all their GPUs
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from labkit import data, launch, models


def parse_args(argv=None) -> argparse.Namespace:
    """Read the run's sizes from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps")
    parser.add_argument("--global-batch", type=int, default=256,
                        help="images per step across all ranks")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--limit", type=int, default=None,
                        help="use only the first LIMIT training images")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a collective may wait before it fails")
    return parser.parse_args(argv)


def my_batches(split, ctx, per_rank: int):
    """Yield this rank's batches forever: DistributedSampler, new shuffle per epoch."""
    sampler = DistributedSampler(range(len(split)), num_replicas=ctx.world_size,
                                 rank=ctx.rank, shuffle=True, seed=0, drop_last=True)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)   # else every epoch repeats the same order
        order = torch.tensor(list(sampler), device=ctx.device)
        for start in range(0, len(order) - per_rank + 1, per_rank):
            index = order[start:start + per_rank]
            yield split.images[index], split.labels[index]
        epoch += 1


def same_on_every_rank(model) -> bool:
    """Tell whether every rank holds exactly the same parameters (DDP's promise)."""
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    top, bottom = mine.clone(), mine.clone()
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    dist.all_reduce(bottom, op=dist.ReduceOp.MIN)
    return torch.equal(top, bottom)


def main(argv=None) -> None:
    """Train, then report loss, images/s and whether the ranks agree (rank 0 prints)."""
    args = parse_args(argv)
    ctx = launch.init_from_env(timeout=args.timeout)
    if args.global_batch % ctx.world_size:
        raise SystemExit(f"--global-batch {args.global_batch} must be a multiple of "
                         f"the world size {ctx.world_size}.")
    per_rank = args.global_batch // ctx.world_size
    split = data.DeviceData.mnist(train=True, device=ctx.device, limit=args.limit)
    torch.manual_seed(0)
    model = models.small_cnn().to(ctx.device)
    model = DDP(model, device_ids=[ctx.device] if ctx.device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if ctx.rank == 0:
        print(f"{ctx.world_size} ranks ({ctx.backend}), {per_rank} images per rank "
              f"per step, {args.steps} steps")
    start = time.perf_counter()
    batches = my_batches(split, ctx, per_rank)
    for step, (images, labels) in zip(range(args.steps), batches):
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()   # DDP averages the gradients over all ranks here
        optimizer.step()
        if ctx.rank == 0 and (step % 20 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.3f}")
    seconds = time.perf_counter() - start
    agree = same_on_every_rank(model.module)
    if ctx.rank == 0:
        print(f"{args.steps * args.global_batch / seconds:,.0f} images/s over "
              f"{ctx.world_size} ranks; parameters identical on every rank: {agree}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
