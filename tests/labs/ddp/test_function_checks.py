"""Lab 03's function check (each rank's shard of the indices): the hint for each
classic mistake. Its program checks are tested in test_programs.py."""

import math

import pytest
import torch

from labkit import checks
from labkit.labs.ddp import checks as ddp


def _fails(check, fn, hint):
    with pytest.raises(checks.ExerciseFailed, match=hint):
        check(fn)


def _no_set_epoch(num_samples, rank, world_size, epoch, seed=0, shuffle=True):
    g = torch.Generator().manual_seed(seed)
    order = (
        torch.randperm(num_samples, generator=g).tolist()
        if shuffle
        else list(range(num_samples))
    )
    total = math.ceil(num_samples / world_size) * world_size
    order += order[: total - len(order)]
    return order[rank::world_size]


def test_shard_indices_hints():
    """Are unpadded shards and a shuffle that ignores the epoch reported?"""
    _fails(
        ddp.shard_indices,
        lambda n, r, w, e, s=0, sh=True: list(range(n))[r::w],
        "ceil",
    )
    _fails(ddp.shard_indices, _no_set_epoch, "seed \\+ epoch")


def _stub(*args):
    raise NotImplementedError()


def test_stub_is_not_done_yet():
    """Does the check call the untouched stub 'not done yet'?"""
    _fails(ddp.shard_indices, _stub, "not done yet")
