"""Tests for labkit.models and labkit.estimate."""

import pytest
import torch

from labkit import estimate, models


def test_small_cnn_shape_and_size():
    """Does the small CNN map (B,1,28,28) to (B,10) with about 0.1 M parameters?"""
    model = models.small_cnn()
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert models.count_parameters(model) == 105_866


def test_deep_mlp_layers_and_slicing():
    """Does deep_mlp have the asked depth, and does slicing keep parameter names?"""
    model = models.deep_mlp(num_layers=4, width=32)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 4 and model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert "3.weight" in dict(model[3:].named_parameters())
    with pytest.raises(ValueError, match="at least 2 layers"):
        models.deep_mlp(num_layers=1)


def test_frozen_parameters_are_not_counted():
    """Does count_parameters skip requires_grad=False?"""
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    assert models.count_parameters(model) == 6


def test_memory_formula_and_measurement_agree():
    """Does one measured Adam step hold exactly the formula's bytes?"""
    model = models.small_cnn()
    images, labels = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    measured = estimate.measure_training_bytes(model, images, labels)
    n = models.count_parameters(model)
    assert measured["weights"] == measured["gradients"] == 4 * n
    assert measured["adam states"] == 8 * n
    assert (
        measured["activations"] > 8 * 16 * 28 * 28 * 4
    )  # at least the first conv's output
    assert sum(measured.values()) == estimate.training_memory_bytes(
        n, 4, measured["activations"]
    )


def test_allreduce_numbers():
    """Do ring all-reduce bytes and time follow 2(n-1)/n, with errors for bad input?"""
    assert estimate.ring_allreduce_bytes(100, 1) == 0
    assert estimate.ring_allreduce_bytes(100, 4) == pytest.approx(600)
    assert estimate.allreduce_seconds(1e9 / 8, 2, 1.25) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        estimate.ring_allreduce_bytes(1, 0)
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        estimate.allreduce_seconds(1, 2, 0)


def test_max_difference_needs_the_same_names():
    """Does comparing state_dicts of different models fail clearly?"""
    with pytest.raises(ValueError, match="different names"):
        models.max_difference({"a": torch.zeros(1)}, {"b": torch.zeros(1)})
