"""DDP on N gloo ranks equals one process.

Covers ``labkit.ddp`` (the workers lab 03 launches); lab 02's ``labkit.dataparallel``
is covered by test_lab02_data_parallel.py. Launches use 2 CPU ranks with one thread
each.
"""

import pytest
import torch

from labkit import ddp, launch, models

# The stated tolerance: N ranks x B/N images vs one process x B images, every
# parameter, after the steps below (float32; measured around 1e-7).
TOLERANCE = 1e-5


def _run(worker, *args, world_size=2):
    return launch.run(
        worker, world_size=world_size, args=args, backend="gloo", timeout=120
    )


@pytest.mark.parametrize("world_size", [2, 4])
def test_ddp_matches_one_process(world_size):
    """Do N ranks with per-rank batch B/N end with the parameters of one with B?"""
    cfg = ddp.TrainConfig(steps=8, global_batch=32, lr=0.1, synthetic=256, warmup=1)
    ranks = _run(ddp.train, cfg, world_size=world_size)
    one = ddp.reference(cfg, threads=1)
    assert models.max_difference(ranks[0]["state"], one["state"]) < TOLERANCE
    assert len({r["checksum"] for r in ranks}) == 1, "replicas drifted apart"
    assert all(r["state"] is None for r in ranks[1:]), "only rank 0 ships its weights"
    mean_loss = sum(r["losses"][-1] for r in ranks) / world_size
    assert mean_loss == pytest.approx(one["losses"][-1], abs=1e-5)


def test_ddp_differs_from_a_wrong_reference():
    """Would the equality test notice a different run (another learning rate)?"""
    cfg = ddp.TrainConfig(steps=4, global_batch=16, synthetic=64, warmup=1)
    other = ddp.TrainConfig(steps=4, global_batch=16, synthetic=64, warmup=1, lr=0.1)
    first, second = ddp.reference(cfg)["state"], ddp.reference(other)["state"]
    gap = models.max_difference(first, second)
    assert gap > 100 * TOLERANCE


def test_collectives_give_sum_copy_and_list():
    """Do all-reduce, broadcast and all-gather return what lab 03 prints?"""
    seen = _run(ddp.collectives)
    for r in seen:
        assert r["all_reduce"][1] == 3.0 and r["broadcast"][1] == 100.0
        assert r["all_gather"][1] == [0.0, 10.0] and r["backend"] == "gloo"


def test_internals_buckets_no_sync_checkpoint(tmp_path):
    """Do buckets shrink in number with the cap, no_sync skip all-reduces, and the
    checkpoint load identically on every rank?"""
    path = tmp_path / "ckpt.pt"
    seen = _run(ddp.internals, (0.25, 25.0, None), 4, str(path))
    for r in seen:
        small, large = r["buckets"][0.25], r["buckets"][25.0]
        assert small["buckets"] > large["buckets"] == 1
        default = r["buckets"][None]   # 25 MB too, but a first bucket of 1 MB
        assert default["buckets"] == 2 and default["mb"][0] <= 1.05
        assert small["hidden"] > 0 == large["hidden"], "one bucket cannot overlap"
        assert r["no_sync"]["allreduce_calls"] == {"plain": 4, "no_sync": 1}
        assert r["no_sync"]["max_grad_difference"] < 1e-6
        assert r["checkpoint"]["trained"] == r["checkpoint"]["loaded"]
    assert path.exists()
    assert len({r["checkpoint"]["loaded"] for r in seen}) == 1


@pytest.mark.parametrize(
    "kwargs, world_size, message",
    [
        ({"global_batch": 63}, 2, "does not split evenly"),
        ({"steps": 2, "warmup": 2}, 1, "must exceed warmup"),
    ],
)
def test_train_config_refuses(kwargs, world_size, message):
    """Does TrainConfig refuse uneven global batches and untimed runs?"""
    with pytest.raises(ValueError, match=message):
        ddp.TrainConfig(**kwargs).check(world_size)


def test_uneven_batch_fails_in_the_worker_not_a_hang():
    """Does a launch with an uneven global batch end as a WorkerError?"""
    cfg = ddp.TrainConfig(steps=3, global_batch=15, synthetic=64, warmup=1)
    with pytest.raises(launch.WorkerError, match="does not split evenly"):
        _run(ddp.train, cfg)


def test_max_difference_needs_the_same_names():
    """Does comparing state_dicts of different models fail clearly?"""
    with pytest.raises(ValueError, match="different names"):
        models.max_difference({"a": torch.zeros(1)}, {"b": torch.zeros(1)})
