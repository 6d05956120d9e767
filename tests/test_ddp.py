"""DDP on N gloo ranks equals one process, and the from-scratch data-parallel helpers.

Covers ``labkit.ddp`` (the workers lab 03 launches) and ``labkit.dataparallel`` (lab
02's replicate/scatter/gather/average). Launches use 2 CPU ranks with one thread each.
"""

import copy

import pytest
import torch
from torch import nn

from labkit import dataparallel, ddp, launch, models, train

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


# ---------------------------------------------------------------- lab 02, by hand


def _problem(batch=37):
    torch.manual_seed(0)
    return (
        models.small_cnn(),
        torch.randn(batch, 1, 28, 28),
        torch.randint(0, 10, (batch,)),
    )


@pytest.mark.parametrize("replicas, threads", [(2, True), (3, False)])
def test_data_parallel_step_equals_one_model(replicas, threads):
    """Does the hand-made data-parallel step (uneven chunks) equal the plain step?"""
    model, images, labels = _problem()
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    devices = dataparallel.replica_devices(replicas, verbose=False)
    for _ in range(3):
        loss = dataparallel.data_parallel_step(
            model, images, labels, opt, devices, threads=threads
        )
        assert loss == pytest.approx(
            train.train_step(reference, images, labels, ref_opt), abs=1e-5
        )
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=TOLERANCE)


def test_scatter_gather_round_trip():
    """Do scatter's chunks (sizes within 1) gather back into the batch?"""
    images, labels = torch.arange(10.0).view(10, 1), torch.arange(10)
    devices = dataparallel.replica_devices(3, verbose=False)
    chunks = dataparallel.scatter(images, labels, devices)
    assert [len(y) for _, y in chunks] == [4, 3, 3]
    assert torch.equal(dataparallel.gather([x for x, _ in chunks], "cpu"), images)


def test_replicas_are_copies():
    """Are replicas equal in value but separate objects from the model?"""
    model = nn.Linear(3, 2)
    copies = dataparallel.replicate(
        model, dataparallel.replica_devices(2, verbose=False)
    )
    assert all(c is not model and torch.equal(c.weight, model.weight) for c in copies)


def test_replica_devices_says_why(capsys):
    """Does replica_devices print its choice (CPU copies when GPUs are too few)?"""
    devices = dataparallel.replica_devices(torch.cuda.device_count() + 1)
    assert all(d.type == "cpu" for d in devices)
    assert "copies on the CPU" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_replica_devices_refuses_bad_counts(bad):
    """Is a non-positive or fractional replica count refused?"""
    with pytest.raises(ValueError, match="positive integer"):
        dataparallel.replica_devices(bad)


@pytest.mark.parametrize(
    "images, labels, message",
    [
        (torch.zeros(4, 1), torch.zeros(3), "4 images but 3 labels"),
        (torch.zeros(1, 1), torch.zeros(1), "cannot feed 2 replicas"),
    ],
)
def test_scatter_refuses(images, labels, message):
    """Does scatter refuse mismatched inputs and batches smaller than the replicas?"""
    with pytest.raises(ValueError, match=message):
        dataparallel.scatter(images, labels, [torch.device("cpu")] * 2)


def test_dataparallel_memory_without_two_gpus(capsys):
    """Does the GPU-0 memory measurement return None and say why without 2 GPUs?"""
    if torch.cuda.device_count() >= 2:
        pytest.skip("2+ GPUs: the measurement runs for real (see the GPU test)")
    assert dataparallel.dataparallel_memory(nn.Linear(2, 2)) is None
    assert "nothing to spread" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2+ GPUs")
def test_dataparallel_memory_gpu0_carries_more():
    """Does GPU 0 peak above the other GPUs in a DataParallel step?"""
    peaks = dataparallel.dataparallel_memory(models.deep_mlp(8, 2048), batch=4096)
    assert peaks[0] > max(peaks[1:])
