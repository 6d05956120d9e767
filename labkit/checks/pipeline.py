"""Checks for lab 05 (pipeline parallelism)."""

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from labkit import estimate, models, pipeline, timeline
from labkit.checks._core import ExerciseFailed, attempt, expect_close, passed

__all__ = ["bubble_formula", "split_microbatches", "gpipe_table", "gpipe_step"]


def bubble_formula(fn) -> None:
    """Check ``fn(num_stages, num_microbatches) -> idle fraction of total time``."""
    name = "bubble_fraction"
    for p, m in [(1, 4), (2, 1), (4, 8), (8, 32)]:
        got = attempt(name, fn, p, m)
        hint = ""
        if isinstance(got, (int, float)) and math.isclose(got, (p - 1) / m):
            hint = ("(p-1)/m is the bubble relative to the ideal time; the fraction "
                    "of the total time divides by the total, m + p - 1 steps.")
        expect_close(name, got, pipeline.bubble_theory(p, m), f"p={p}, m={m}", hint)
    passed(name, "With m >= 4p the bubble drops under 20%.")


def split_microbatches(fn) -> None:
    """Check ``fn(inputs, targets, m, num_stages)``: equal chunks, clear ValueErrors."""
    name = "split_microbatches"
    inputs, targets = torch.arange(12.0).view(12, 1), torch.arange(12)
    got = attempt(name, fn, inputs, targets, 4, 2)
    want = pipeline.split_microbatches(inputs, targets, 4, 2)
    if len(got) != 4 or any(not (torch.equal(a, c) and torch.equal(b, d))
                            for (a, b), (c, d) in zip(got, want)):
        raise ExerciseFailed(f"{name}: 12 samples in 4 micro-batches should be 4 pairs "
                             "of 3 consecutive samples, inputs and targets aligned.")
    for args, what in [((5, 2), "12 samples into 5 micro-batches"),
                       ((2, 4), "2 micro-batches for 4 stages")]:
        try:
            attempt(name, fn, inputs, targets, *args)
        except ValueError as err:
            if not any(ch.isdigit() for ch in str(err)):
                raise ExerciseFailed(f"{name}: for {what} say the numbers in the "
                                     f"message, got {str(err)!r}.") from None
            continue
        raise ExerciseFailed(f"{name}: {what} must raise ValueError (real pipelines "
                             "crash or hang there), but nothing was raised.")
    passed(name, "Bad sizes fail in the first line, not as a hang on rank 3.")


def gpipe_table(fn) -> None:
    """Check ``fn(p, m)`` builds GPipe's rank x step table of "F3"/"B3"/None."""
    name = "gpipe_table"
    for p, m in [(2, 2), (3, 4), (4, 8)]:
        want = [[None if a is None else str(a) for a in row]
                for row in pipeline.schedule("gpipe", p, m)]
        got = attempt(name, fn, p, m)
        if got != want:
            hint = (f"{p} rows (ranks) of {2 * (m + p - 1)} steps each: rank r does "
                    f"F0 at step r, and B0 of the last rank follows F{m - 1}. "
                    "Expected:\n" + timeline.as_text(pipeline.schedule("gpipe", p, m)))
            raise ExerciseFailed(f"{name}: wrong table for p={p}, m={m}: {hint}")
    passed(name, "Count the dots: 2(p-1) idle steps on every rank.")


def _reference(model, inputs, targets):
    reference = copy.deepcopy(model)
    F.cross_entropy(reference(inputs), targets).backward()
    return reference


def gpipe_step(fn) -> None:
    """Check ``fn(stages, inputs, targets, m) -> loss`` leaves full-batch gradients."""
    name = "gpipe_step"
    torch.manual_seed(0)
    model = models.deep_mlp(4, width=16)
    inputs, targets = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    reference = _reference(model, inputs, targets)
    want_loss = F.cross_entropy(model(inputs), targets).item()
    for m in (1, 2, 4):
        trial = copy.deepcopy(model)
        stages = [trial[:5], trial[5:]]
        loss = attempt(name, fn, stages, inputs, targets, m)
        expect_close(name, loss, want_loss, f"the loss with m={m}",
                     "Return the full-batch mean: the mean of the micro-batch losses.",
                     rel=1e-4)
        for (pname, p), q in zip(trial.named_parameters(), reference.parameters()):
            if p.grad is None:
                raise ExerciseFailed(f"{name}: {pname} got no gradient with m={m}.")
            if not torch.allclose(p.grad, q.grad, atol=1e-6):
                ratio = (p.grad.norm() / q.grad.norm()).item()
                hint = (f"Gradients are {ratio:.2f}x the full batch's: divide each "
                        f"micro-batch loss by m before backward."
                        if abs(ratio - m) < 0.01 else
                        "Run every micro-batch's backward and let .grad accumulate.")
                raise ExerciseFailed(f"{name}: with m={m}, {pname}.grad differs from "
                                     f"the full-batch gradient. {hint}")
    passed(name, "Same gradients as the full batch, for every micro-batch count.")
