"""Lab 00's checks: does each classic mistake get its specific hint, and any
correct answer (of any number type) pass?"""

import pytest
import torch

from labkit import checks
from labkit.labs.environment import checks as environment


def _fails(check, fn, hint):
    with pytest.raises(checks.ExerciseFailed, match=hint):
        check(fn)


def test_count_parameters_hints():
    """Are frozen parameters and the stub reported?"""
    _fails(
        environment.count_parameters,
        lambda m: sum(p.numel() for p in m.parameters()),
        "Frozen parameters",
    )

    def stub(model):
        raise NotImplementedError()

    _fails(environment.count_parameters, stub, "not done yet")


@pytest.mark.parametrize(
    "copies, hint",
    [
        (1, "weights only"),
        (2, "Adam keeps two more"),
        (3, r"two states per parameter \(m and v\), not one"),
    ],
)
def test_training_memory_hints(copies, hint):
    """Does each missing copy get its own hint?"""
    _fails(environment.training_memory, lambda n, b, a: n * b * copies + a, hint)


def test_training_memory_forgotten_activations():
    """Are forgotten activation bytes named?"""
    _fails(
        environment.training_memory, lambda n, b, a: n * b * 4, "Add the activation bytes"
    )


@pytest.mark.parametrize(
    "fn, hint",
    [
        (lambda n, w, link, b, a: n * b / (link * 1e9), "moves each byte twice"),
        (lambda n, w, link, b, a: 2 * n * b / (link * 1e9), r"2\(n-1\)/n"),
        (lambda n, w, link, b, a: 2 * (w - 1) / w * n * b / (link * 1e9) / 8,
         "gigaBYTES"),
        (lambda n, w, link, b, a: 2 * (w - 1) / w * n * b / (link * 1e9),
         "latency is missing"),
        (lambda n, w, link, b, a: 2 * (w - 1) / w * n * b / (link * 1e9) + a,
         r"each of its 2\(n-1\) steps"),
    ],
)
def test_allreduce_hints(fn, hint):
    """Do the usual all-reduce mistakes get their hints?"""
    _fails(environment.allreduce_time, fn, hint)


def test_allreduce_single_gpu_hint():
    """Is a nonzero time for one GPU explained?"""
    _fails(
        environment.allreduce_time,
        lambda n, w, link, b, a: 2 * (w - 1) / w * n * b / (link * 1e9) + (w == 1),
        "nothing to synchronise",
    )


def _passes(check, fn, capsys):
    check(fn)
    assert "✅" in capsys.readouterr().out


def test_numbers_of_any_type_pass(capsys):
    """Are a NumPy integer and a one-element tensor judged by their value?"""
    import numpy as np

    _passes(environment.count_parameters,
            lambda m: np.int64(sum(p.numel() for p in m.parameters() if p.requires_grad)),
            capsys)
    _passes(environment.training_memory,
            lambda n, b, a: torch.tensor(16 * n * b // 4 + a, dtype=torch.float64),
            capsys)
