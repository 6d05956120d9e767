"""Lab 02's from-scratch data-parallel helpers (``labkit.dataparallel``), and
``models.max_difference`` that every equality proof uses."""

import copy

import pytest
import torch
from torch import nn

from labkit import dataparallel, models, train

# The stated tolerance: data-parallel step vs one model, every parameter (float32;
# measured around 1e-7).
TOLERANCE = 1e-5


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
