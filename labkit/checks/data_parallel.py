"""Checks for the DataParallel and DDP labs: scatter, gradient averaging, the
``module.`` prefix, sharding like DistributedSampler, LR scaling, accumulation."""

import math

import torch
from torch import nn
from torch.utils.data import DistributedSampler

from labkit.checks._core import ExerciseFailed, attempt, expect_close, passed

__all__ = [
    "scatter_batch",
    "average_gradients",
    "strip_module_prefix",
    "shard_indices",
    "scaled_lr",
    "accumulation_steps",
]


def scatter_batch(fn) -> None:
    """Check ``fn(images, labels, num_replicas)`` splits a batch into aligned chunks."""
    name = "scatter_batch"
    labels = torch.arange(10)
    images = labels.float().view(10, 1).expand(10, 3).clone()
    for replicas, want in [(2, [5, 5]), (3, [4, 3, 3]), (4, [3, 3, 2, 2])]:
        chunks = list(attempt(name, fn, images, labels, replicas))
        sizes = [len(y) for _, y in chunks]
        if sizes != want:
            raise ExerciseFailed(
                f"{name}: 10 samples over {replicas} replicas should give sizes {want} "
                f"(as equal as possible, larger first), got {sizes}. Try "
                "images.tensor_split(num_replicas)."
            )
        if any(not torch.equal(x[:, 0].long(), y) for x, y in chunks):
            raise ExerciseFailed(
                f"{name}: images and labels of a chunk do not match: "
                "split both the same way."
            )
        if torch.cat([y for _, y in chunks]).tolist() != list(range(10)):
            raise ExerciseFailed(
                f"{name}: the chunks, put back together, must be the "
                "batch in its original order (no shuffling, no loss)."
            )
    try:
        fn(images[:2], labels[:2], 3)
    except ValueError:
        pass
    else:
        raise ExerciseFailed(
            f"{name}: a batch of 2 over 3 replicas leaves a replica "
            "with nothing: raise ValueError saying so."
        )
    passed(name, "Same split as tensor_split, and a clear error for too small a batch.")


def _replica_grads():
    """Return per-replica gradients of the chunk-mean loss, chunk sizes, full grads."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    images, labels = torch.randn(7, 3), torch.tensor([0, 1, 1, 0, 1, 0, 0])
    loss_fn = nn.CrossEntropyLoss()
    sizes, grads = [4, 3], []
    for x, y in zip(images.split(sizes), labels.split(sizes)):
        grads.append(
            torch.autograd.grad(loss_fn(model(x), y), list(model.parameters()))
        )
    full = torch.autograd.grad(loss_fn(model(images), labels), list(model.parameters()))
    return [list(g) for g in grads], sizes, list(full)


def average_gradients(fn) -> None:
    """Check ``fn(replica_grads, chunk_sizes)`` weights each replica by its chunk."""
    name = "average_gradients"
    grads, sizes, full = _replica_grads()
    got = attempt(name, fn, grads, sizes)
    if not isinstance(got, (list, tuple)) or len(got) != len(full):
        raise ExerciseFailed(
            f"{name}: return one tensor per parameter ({len(full)}), "
            f"got {type(got).__name__}."
        )
    if all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, full)):
        passed(name, "Weighted by chunk size, the average is the full-batch gradient.")
        return
    plain = [sum(g[i] for g in grads) / len(grads) for i in range(len(full))]
    summed = [sum(g[i] for g in grads) for i in range(len(full))]
    if all(torch.allclose(g, p, atol=1e-6) for g, p in zip(got, plain)):
        hint = (
            "That is the plain mean of the replicas: with chunks of 4 and 3 a "
            "sample in the small chunk counts more. Weight replica i by n_i / N."
        )
    elif all(torch.allclose(g, s, atol=1e-6) for g, s in zip(got, summed)):
        hint = "That is the sum: weight replica i by n_i / N (the weights add up to 1)."
    else:
        hint = "Parameter i's gradient is sum over replicas of n_r / N * grads[r][i]."
    raise ExerciseFailed(
        f"{name}: the result differs from the full-batch gradient. {hint}"
    )


def strip_module_prefix(fn) -> None:
    """Check ``fn(state_dict)`` drops the leading ``module.`` and nothing else."""
    name = "strip_module_prefix"
    model = nn.Sequential(nn.Linear(2, 2))
    model.add_module("module", nn.Linear(2, 1))  # a layer really called "module"
    wrapped = nn.DataParallel(model)
    got = attempt(name, fn, wrapped.state_dict())
    want = model.state_dict()
    if not isinstance(got, dict) or list(got) != list(want):
        hint = (
            "Remove only a LEADING 'module.': key[len('module.'):] when "
            "key.startswith('module.'). str.replace also hits a layer named "
            "'module' inside the model."
        )
        raise ExerciseFailed(
            f"{name}: expected keys {list(want)}, got "
            f"{list(got) if isinstance(got, dict) else got!r}. {hint}"
        )
    fresh = nn.Sequential(nn.Linear(2, 2))
    fresh.add_module("module", nn.Linear(2, 1))
    fresh.load_state_dict(got)
    if any(not torch.equal(got[k], want[k]) for k in want):
        raise ExerciseFailed(
            f"{name}: keep every tensor as it is; only rename the keys."
        )
    passed(name, "The checkpoint now loads into the plain model (strict=True).")


def _sampler_indices(num_samples, rank, world_size, epoch, seed, shuffle) -> list:
    sampler = DistributedSampler(
        range(num_samples),
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
    )
    sampler.set_epoch(epoch)
    return list(sampler)


def _shard_hint(got, num_samples, rank, world_size, epoch, seed) -> str:
    """Name the classic sharding mistake that produced ``got``."""
    per_rank = math.ceil(num_samples / world_size)
    if len(got) != per_rank:
        return (
            f"Every rank must get ceil(N / world_size) = {per_rank} indices, padding "
            "the list with its first indices so all ranks do the same number of "
            "steps (uneven ranks hang DDP)."
        )
    if epoch and got == _sampler_indices(num_samples, rank, world_size, 0, seed, True):
        return (
            "You shuffled the same way every epoch: seed the generator with "
            "seed + epoch (that is what set_epoch is for)."
        )
    return (
        "Shuffle all N indices with torch.randperm(N, generator=g) where "
        "g.manual_seed(seed + epoch), pad, then take every world_size-th index "
        "starting at rank: indices[rank::world_size]."
    )


def shard_indices(fn) -> None:
    """Check ``fn(num_samples, rank, world_size, epoch, seed, shuffle)`` vs sampler."""
    name = "shard_indices"
    cases = [
        (10, 0, 2, 0, 0, False),
        (10, 1, 2, 0, 0, False),
        (10, 1, 3, 0, 0, False),
        (11, 0, 4, 0, 0, True),
        (11, 3, 4, 0, 0, True),
        (20, 1, 2, 3, 7, True),
    ]
    for num_samples, rank, world_size, epoch, seed, shuffle in cases:
        got = attempt(name, fn, num_samples, rank, world_size, epoch, seed, shuffle)
        got = (
            [int(i) for i in got]
            if isinstance(got, (list, tuple, torch.Tensor))
            else got
        )
        want = _sampler_indices(num_samples, rank, world_size, epoch, seed, shuffle)
        if got != want:
            hint = (
                _shard_hint(got, num_samples, rank, world_size, epoch, seed)
                if isinstance(got, list)
                else "Return a list of ints."
            )
            raise ExerciseFailed(
                f"{name}: N={num_samples}, rank {rank} of {world_size}, epoch {epoch}, "
                f"seed {seed}, shuffle={shuffle}: DistributedSampler gives {want}, you "
                f"gave {got}. {hint}"
            )
    passed(name, "Index for index what DistributedSampler (with set_epoch) yields.")


def _lr(step, base_lr, base_batch, global_batch, warmup_steps) -> float:
    target = base_lr * global_batch / base_batch
    if step >= warmup_steps:
        return target
    return base_lr + (target - base_lr) * step / warmup_steps


def scaled_lr(fn) -> None:
    """Check ``fn(step, base_lr, base_batch, global_batch, warmup_steps)``."""
    name = "scaled_lr"
    for step, warmup in [(0, 5), (2, 5), (5, 5), (100, 5), (0, 0), (3, 0)]:
        args = (step, 0.1, 256, 2048, warmup)
        got = attempt(name, fn, *args)
        want = _lr(*args)
        hint = ""
        if isinstance(got, (int, float)):
            if math.isclose(got, 0.1) and step > 0:
                hint = (
                    "The LR never grows: multiply base_lr by global_batch / "
                    "base_batch (reached gradually during warm-up)."
                )
            elif step < warmup and math.isclose(
                got, 0.8 * step / warmup, abs_tol=1e-12
            ):
                hint = (
                    "Warm-up here starts at base_lr (Goyal et al.), not at 0: "
                    "base_lr + (target - base_lr) * step / warmup_steps."
                )
            elif step < warmup and math.isclose(got, 0.8):
                hint = (
                    "During warm-up (step < warmup_steps) ramp up linearly to target."
                )
        expect_close(
            name,
            got,
            want,
            f"step {step}, base_lr 0.1 at batch 256, global "
            f"batch 2048, {warmup} warm-up steps",
            hint,
        )
    passed(name, "8x the batch, 8x the learning rate, reached gradually.")


def accumulation_steps(fn) -> None:
    """Check ``fn(global_batch, per_rank_batch, world_size)`` and its ValueError."""
    name = "accumulation_steps"
    for global_batch, per_rank, world_size, want in [
        (256, 32, 8, 1),
        (1024, 32, 8, 4),
        (512, 64, 2, 4),
        (64, 64, 1, 1),
    ]:
        got = attempt(name, fn, global_batch, per_rank, world_size)
        hint = (
            "Each optimizer step sees per_rank_batch x world_size x steps images: "
            "solve for steps."
        )
        expect_close(
            name,
            got,
            want,
            f"global {global_batch}, {per_rank} per rank, {world_size} ranks",
            hint,
        )
        if not isinstance(got, int):
            raise ExerciseFailed(
                f"{name}: return an int (a number of micro-batches), "
                f"got {got!r}: use // after checking divisibility."
            )
    for bad in [(1000, 32, 8), (96, 64, 1)]:
        try:
            fn(*bad)
        except ValueError:
            continue
        raise ExerciseFailed(
            f"{name}: global batch {bad[0]} is not a multiple of "
            f"{bad[1]} x {bad[2]}: raise ValueError instead of "
            "silently training with another batch size."
        )
    passed(name, "Accumulate k micro-batches under no_sync, all-reduce on the last.")
