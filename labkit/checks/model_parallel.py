"""Checks for lab 04 (model parallelism): how many devices, a balanced split, and how
long two devices work at once."""

import math

import torch
from torch import nn

from labkit import estimate, models, timeline
from labkit.checks._core import ExerciseFailed, attempt, expect_close, passed

__all__ = ["min_devices", "split_in_two", "overlap_seconds"]


def min_devices(fn) -> None:
    """Check ``fn(num_params, device_gib, bytes_per_value) -> int`` devices to train."""
    name = "min_devices"
    for num_params, gib, width in [(1_000_000, 80, 4), (7_000_000_000, 80, 4),
                                   (70_000_000_000, 141, 2), (5 * 2**30, 80, 4)]:
        need = estimate.training_memory_bytes(num_params, width)
        want = math.ceil(need / (gib * 2**30))
        got = attempt(name, fn, num_params, gib, width)
        hint = ""
        if isinstance(got, (int, float)) and got == math.ceil(need / (gib * 1e9)):
            hint = "A GiB is 2**30 bytes, not 1e9."
        elif isinstance(got, (int, float)) and got < want:
            hint = ("Training holds weights, gradients and Adam's two states: "
                    "estimate.training_memory_bytes, not just the weights.")
        elif isinstance(got, float):
            hint = "Round up to whole devices (math.ceil) and return an int."
        if got != want or not isinstance(got, int):
            raise ExerciseFailed(f"{name}: {num_params:,} parameters, {gib} GiB "
                                 f"devices, {width} B/value: expected {want}, got "
                                 f"{got!r}. {hint}")
    passed(name, "Weights alone would fit; weights + gradients + Adam do not.")


def split_in_two(fn) -> None:
    """Check ``fn(model) -> (first, second)``: balanced halves sharing the weights."""
    name = "split_in_two"
    for num_layers in (4, 6, 8):
        model = models.deep_mlp(num_layers, width=32)
        halves = attempt(name, fn, model)
        if not (isinstance(halves, (tuple, list)) and len(halves) == 2):
            raise ExerciseFailed(f"{name}: return a pair (first, second), got "
                                 f"{halves!r}.")
        first, second = halves
        x = torch.randn(3, 1, 28, 28)
        if not torch.allclose(second(first(x)), model(x)):
            raise ExerciseFailed(f"{name}: second(first(x)) differs from model(x) for "
                                 f"deep_mlp({num_layers}): keep every layer, in order.")
        ours = {id(p) for p in model.parameters()}
        if any(id(p) not in ours for h in halves for p in h.parameters()):
            raise ExerciseFailed(f"{name}: the halves hold copies of the weights; "
                                 "slice the model (model[:cut]) so they share its "
                                 "parameters.")
        counts = [sum(isinstance(m, nn.Linear) for m in h) for h in halves]
        if counts[0] != counts[1]:
            raise ExerciseFailed(f"{name}: deep_mlp({num_layers}) cut into "
                                 f"{counts[0]} + {counts[1]} Linear layers: cut at the "
                                 "middle Linear so each device gets the same work.")
    passed(name, "Slicing keeps parameter names (`9.weight`): state dicts still match.")


def _events(rows):
    return [timeline.Event(row, kind, 0, start, end) for row, kind, start, end in rows]


def overlap_seconds(fn) -> None:
    """Check ``fn(events) -> seconds`` during which two or more rows are busy."""
    name = "overlap_seconds"
    cases = [("one row after the other", _events([(0, "F", 0, 1), (1, "F", 1, 2)])),
             ("half overlapping", _events([(0, "F", 0, 2), (1, "F", 1, 3)])),
             ("unsorted, three rows", _events([(2, "B", 5, 6), (0, "F", 0, 4),
                                               (1, "F", 1, 2), (1, "B", 3, 5)]))]
    for case, events in cases:
        got = attempt(name, fn, events)
        want = timeline.busy_overlap(events)
        hint = ("Sort the start and end moments, walk them keeping a count of busy "
                "rows, and add up the time while the count is 2 or more.")
        expect_close(name, got, want, case, hint)
    passed(name, "A measured split model overlaps by ~0 s: one device works at a time.")
