"""Do the lab 02 and lab 03 function checks give the hint for each classic mistake?

Lab 02's program checks (parallel_apply, the data-parallel step) are tested in
test_lab02_data_parallel.py.
"""

import math

import pytest
import torch

from labkit import checks
from labkit.checks import data_parallel, ddp


def _fails(check, fn, hint):
    with pytest.raises(checks.ExerciseFailed, match=hint):
        check(fn)


def _stub(*args):
    raise NotImplementedError()


@pytest.mark.parametrize(
    "check",
    [
        data_parallel.strip_module_prefix,
        ddp.shard_indices,
    ],
)
def test_stub_is_not_done_yet(check):
    """Does every check call the untouched stub 'not done yet'?"""
    _fails(check, _stub, "not done yet")


def test_strip_module_prefix_hints():
    """Is str.replace (which also renames a layer called 'module') caught?"""
    _fails(
        data_parallel.strip_module_prefix,
        lambda sd: {k.replace("module.", ""): v for k, v in sd.items()},
        "LEADING",
    )
    _fails(
        data_parallel.strip_module_prefix,
        lambda sd: {k.removeprefix("module."): v * 0 for k, v in sd.items()},
        "keep every tensor",
    )


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
