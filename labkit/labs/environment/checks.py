"""Checks for the environment-and-hardware lab: parameters, memory, all-reduce time.

A number may come back as a Python int or float, a NumPy scalar or a one-element
tensor: the checks judge its value, not its type.
"""

import numbers

import torch
from torch import nn

from labkit import estimate, models
from labkit.checks._core import attempt, expect_close, passed
from labkit.checks._reference import use_reference
from labkit.checks._solved import has_passed, solved
from labkit.messages import _

__all__ = ["use_reference", "solved", "has_passed",
           "count_parameters", "training_memory", "allreduce_time"]


def _number(exercise, fn, *args):
    """Call the learner's ``fn``; return its answer as an int or float if it is one."""
    got = attempt(exercise, fn, *args)
    if torch.is_tensor(got) and got.numel() == 1:
        got = got.item()
    if isinstance(got, numbers.Integral) and not isinstance(got, bool):
        return int(got)
    if isinstance(got, numbers.Real) and not isinstance(got, bool):
        return float(got)
    return got


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
        (_("a model whose first layer is frozen"), frozen, 12),
    ]
    for case, model, want in cases:
        got = _number(name, fn, model)
        hint = (
            _("Frozen parameters (requires_grad=False) get no gradient or Adam state: "
              "skip them.")
            if model is frozen
            else _("Sum p.numel() over model.parameters(): weights and biases both "
                   "count.")
        )
        expect_close(name, got, want, case, hint)
    passed(name, _("Biases count too, and frozen weights cost no gradient memory."))


def training_memory(fn) -> None:
    """Check ``fn(num_params, bytes_per_value, activation_bytes) -> bytes``."""
    name = "training_memory_bytes"
    for num_params, width, activations in [
        (1_000_000, 4, 0),
        (7_000_000_000, 2, 10**9),
        (123_456, 4, 5_000),
    ]:
        got = _number(name, fn, num_params, width, activations)
        want = estimate.training_memory_bytes(num_params, width, activations)
        copies = (
            (got - activations) / (num_params * width)
            if isinstance(got, (int, float))
            else None
        )
        hint = {
            1: _("You counted the weights only: gradients and Adam's two states "
                 "(m and v) are the same size."),
            2: _("Weights and gradients are there; Adam keeps two more states (m and "
                 "v)."),
            3: _("Adam keeps two states per parameter (m and v), not one."),
        }.get(round(copies) if copies is not None else None, "")
        if got == want - activations and activations:
            hint = _("Add the activation bytes: they are passed in, not estimated "
                     "here.")
        expect_close(
            name,
            got,
            want,
            f"num_params={num_params:,}, bytes_per_value={width}, "
            f"activation_bytes={activations:,}",
            hint,
        )
    passed(name, _("16 bytes per parameter in fp32 before a single activation."))


def allreduce_time(fn) -> None:
    """Check ``fn(num_params, world_size, link_gbytes_per_s, bytes_per_value,
    latency_s) -> seconds`` for a ring all-reduce."""
    name = "allreduce_seconds"
    cases = [
        (25_000_000, 2, 1.25, 4, 0.0),
        (25_000_000, 8, 12.5, 4, 0.0),
        (7_000_000_000, 8, 450.0, 2, 0.0),
        (25_000_000, 1, 12.5, 4, 0.0),
        (1_000, 8, 450.0, 4, 5e-6),   # a tiny message: latency dominates
        (25_000_000, 4, 12.5, 4, 20e-6),
    ]
    for num_params, world_size, link, width, latency in cases:
        got = _number(name, fn, num_params, world_size, link, width, latency)
        want = estimate.allreduce_seconds(num_params, world_size, link, width, latency)
        hint = _allreduce_hint(got, want, num_params, world_size, link, width, latency)
        expect_close(
            name,
            got,
            want,
            _("{num_params:,} params, {world_size} GPUs, {link} GB/s, {width} B/value, "
              "latency {latency_us:g} us").format(
                  num_params=num_params, world_size=world_size, link=link, width=width,
                  latency_us=latency * 1e6),
            hint,
        )
    passed(name, _("Bandwidth bounds large messages, latency small ones (lab 06 fits "
                   "both)."))


def _allreduce_hint(got, want, num_params, world_size, link, width, latency) -> str:
    """Name the classic mistake in an all-reduce time estimate."""
    if not isinstance(got, (int, float)) or not want:
        return (_("With one GPU there is nothing to synchronise: 0 seconds.")
                if world_size == 1 and got != 0 else "")
    plain = num_params * width / (link * 1e9)
    bandwidth = want - 2 * (world_size - 1) * latency
    close = lambda a, b: abs(a - b) < 1e-9 * max(abs(b), 1e-15)   # noqa: E731
    if latency and close(got, bandwidth):
        return _("The latency is missing: a ring takes 2(n-1) = {steps} steps, and "
                 "each step pays the link's latency once.").format(
                     steps=2 * (world_size - 1))
    if latency and close(got, bandwidth + latency):
        return _("The ring pays the latency in each of its 2(n-1) steps, not once.")
    if close(got * 8, want):
        return _("Units: the link is in gigaBYTES per second; 10 Gbit/s is 1.25 GB/s.")
    if close(got, plain):
        return _("A ring all-reduce moves each byte twice: reduce-scatter, all-gather")
    if close(got, 2 * plain):
        return _("Each GPU sends 2(n-1)/n of the bytes, not 2x.")
    return ""
