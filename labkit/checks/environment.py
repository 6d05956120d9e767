"""Checks for the environment-and-hardware lab: parameters, memory, all-reduce time."""

from torch import nn

from labkit import estimate, models
from labkit.checks._core import attempt, expect_close, passed

__all__ = ["count_parameters", "training_memory", "allreduce_time"]


def count_parameters(fn) -> None:
    """Check ``fn(model) -> int`` counts trainable parameters only."""
    name = "count_parameters"
    frozen = nn.Sequential(nn.Linear(10, 5), nn.Linear(5, 2))
    frozen[0].requires_grad_(False)
    cases = [
        ("nn.Linear(10, 5)", nn.Linear(10, 5), 55),
        (
            "models.small_cnn()",
            models.small_cnn(),
            models.count_parameters(models.small_cnn()),
        ),
        ("a model whose first layer is frozen", frozen, 12),
    ]
    for case, model, want in cases:
        got = attempt(name, fn, model)
        hint = (
            "Frozen parameters (requires_grad=False) get no gradient or Adam state: "
            "skip them."
            if case.startswith("a model")
            else "Sum p.numel() over model.parameters(): weights and biases both count."
        )
        expect_close(name, got, want, case, hint)
    passed(name, "Biases count too, and frozen weights cost no gradient memory.")


def training_memory(fn) -> None:
    """Check ``fn(num_params, bytes_per_value, activation_bytes) -> bytes``."""
    name = "training_memory_bytes"
    for num_params, width, activations in [
        (1_000_000, 4, 0),
        (7_000_000_000, 2, 10**9),
        (123_456, 4, 5_000),
    ]:
        got = attempt(name, fn, num_params, width, activations)
        want = estimate.training_memory_bytes(num_params, width, activations)
        copies = (
            (got - activations) / (num_params * width)
            if isinstance(got, (int, float))
            else None
        )
        hint = {
            1: "You counted the weights only: gradients and Adam's two states "
            "(m and v) are the same size.",
            2: "Weights and gradients are there; Adam keeps two more states (m and v).",
            3: "Adam keeps two states per parameter (m and v), not one.",
        }.get(round(copies) if copies is not None else None, "")
        if got == want - activations and activations:
            hint = "Add the activation bytes: they are passed in, not estimated here."
        expect_close(
            name,
            got,
            want,
            f"num_params={num_params:,}, bytes_per_value={width}, "
            f"activation_bytes={activations:,}",
            hint,
        )
    passed(name, "16 bytes per parameter in fp32 before a single activation.")


def allreduce_time(fn) -> None:
    """Check ``fn(num_params, world_size, link_gbytes_per_s, bytes_per_value) -> s``."""
    name = "allreduce_seconds"
    cases = [
        (25_000_000, 2, 1.25, 4),
        (25_000_000, 8, 12.5, 4),
        (7_000_000_000, 8, 450.0, 2),
        (25_000_000, 1, 12.5, 4),
    ]
    for num_params, world_size, link, width in cases:
        got = attempt(name, fn, num_params, world_size, link, width)
        want = estimate.allreduce_seconds(num_params, world_size, link, width)
        plain = num_params * width / (link * 1e9)
        hint = ""
        if (
            isinstance(got, (int, float))
            and want
            and abs(got - plain) < 1e-9 * plain + 1e-15
        ):
            hint = "A ring all-reduce moves each byte twice: reduce-scatter, all-gather"
        elif (
            isinstance(got, (int, float))
            and want
            and abs(got - 2 * plain) < 1e-9 * plain
        ):
            hint = "Each GPU sends 2(n-1)/n of the bytes, not 2x."
        elif world_size == 1 and got != 0:
            hint = "With one GPU there is nothing to synchronise: 0 seconds."
        if isinstance(got, (int, float)) and want and abs(got * 8 - want) < 1e-9 * want:
            hint = "Units: the link is in gigaBYTES per second; 10 Gbit/s is 1.25 GB/s."
        expect_close(
            name,
            got,
            want,
            f"{num_params:,} params, {world_size} GPUs, {link} GB/s, {width} B/value",
            hint,
        )
    passed(name, "Bandwidth, not compute, bounds gradient sync on slow links.")
