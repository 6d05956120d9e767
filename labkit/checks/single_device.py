"""Checks for the single-device lab: device, transform, mini-batches, one step."""

import copy
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from labkit import data, train
from labkit.checks._core import ExerciseFailed, attempt, passed
from labkit.checks._reference import use_reference

__all__ = ["use_reference", "device_choice", "mnist_transform", "minibatches", "train_step"]


def device_choice(fn) -> None:
    """Check ``fn() -> torch.device`` picks cuda only when CUDA is really available."""
    name = "choose_device"
    for available, want in [(False, "cpu"), (True, "cuda")]:
        # Fake both answers, however the learner asks: is_available(), device_count()
        # or torch.accelerator (which asks torch.cuda.is_available()).
        with mock.patch("torch.cuda.is_available", lambda: available), \
                mock.patch("torch.cuda.device_count", lambda: int(available)):
            got = attempt(name, fn)
        if not isinstance(got, torch.device):
            raise ExerciseFailed(f"{name}: return a torch.device (torch.device("
                                 f"'cuda') or torch.device('cpu')), got {got!r}.")
        if got.type != want:
            hint = (
                "`torch.cuda.is_available` without () is a function object, and a "
                "function is always truthy: call it."
                if want == "cpu"
                else "When CUDA is available, return torch.device('cuda') (or 'cuda:0')."
            )
            raise ExerciseFailed(
                f"{name}: with CUDA available={available} expected "
                f"{want!r}, got {got.type!r}. {hint}"
            )
    passed(name, "The seed's bug (no brackets) would have picked CUDA on a laptop.")


def mnist_transform(fn) -> None:
    """Check ``fn()`` turns a PIL 28x28 image into a normalized (1, 28, 28) tensor."""
    name = "mnist_transform"
    pixels = np.zeros((28, 28), dtype=np.uint8)
    pixels[0, 0] = 255
    transform = attempt(name, fn)
    try:
        out = transform(Image.fromarray(pixels, mode="L"))
    except TypeError as err:
        raise ExerciseFailed(
            f"{name}: applying your transform raised TypeError ({err}). "
            "Did you write transforms.ToTensor without ()? Compose "
            "needs instances: transforms.ToTensor()."
        ) from None
    if (
        not isinstance(out, torch.Tensor)
        or out.shape != (1, 28, 28)
        or out.dtype != torch.float32
    ):
        raise ExerciseFailed(
            f"{name}: expected a float32 tensor of shape (1, 28, 28), got "
            f"{getattr(out, 'dtype', type(out))} {getattr(out, 'shape', '')}."
        )
    want_black, want_white = -data.MEAN / data.STD, (1 - data.MEAN) / data.STD
    if not (
        abs(out[0, 1, 1] - want_black) < 1e-4 and abs(out[0, 0, 0] - want_white) < 1e-4
    ):
        raise ExerciseFailed(
            f"{name}: a black pixel should become {want_black:.4f} and a "
            f"white one {want_white:.4f}, got {out[0, 1, 1]:.4f} and "
            f"{out[0, 0, 0]:.4f}. Normalize((MEAN,), (STD,)) after "
            "ToTensor(), with data.MEAN and data.STD."
        )
    passed(name, "Both brackets in place; pixels are centred and scaled.")


def minibatches(fn) -> None:
    """Check ``fn(images, labels, batch_size, generator)`` yields shuffled batches."""
    name = "iterate_minibatches"
    labels = torch.arange(10)
    images = labels.float().view(10, 1, 1, 1).expand(10, 1, 2, 2).clone()
    gen = torch.Generator().manual_seed(0)
    epochs = [list(attempt(name, fn, images, labels, 4, gen)) for _ in range(2)]
    sizes = [len(y) for _, y in epochs[0]]
    if sizes != [4, 4, 2]:
        raise ExerciseFailed(
            f"{name}: 10 samples in batches of 4 should give sizes "
            f"[4, 4, 2] (keep the last, short batch), got {sizes}."
        )
    for batches in epochs:
        seen = torch.cat([y for _, y in batches])
        if sorted(seen.tolist()) != list(range(10)):
            raise ExerciseFailed(
                f"{name}: each epoch must visit every sample once, saw "
                f"{seen.tolist()}. Slice one permutation, don't sample."
            )
        if any(not torch.equal(x[:, 0, 0, 0].long(), y) for x, y in batches):
            raise ExerciseFailed(
                f"{name}: images and labels went out of step: index both "
                "with the same indices."
            )
    orders = [torch.cat([y for _, y in b]).tolist() for b in epochs]
    if orders[0] == list(range(10)) or orders[0] == orders[1]:
        raise ExerciseFailed(
            f"{name}: the order should be shuffled, and differ between "
            f"epochs; got {orders}. Draw torch.randperm(n, generator=...) "
            "on every call."
        )
    passed(name, "One gather per batch, no per-sample Python: that is the fast path.")


def _tiny_problem():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    images, labels = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    return model, images, labels


def train_step(fn) -> None:
    """Check ``fn(model, images, labels, optimizer)`` matches a reference step."""
    name = "train_step"
    model, images, labels = _tiny_problem()
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(2):
        want = train.train_step(reference, images, labels, ref_opt)
        got = attempt(name, fn, model, images, labels, opt)
        if not isinstance(got, float):
            raise ExerciseFailed(
                f"{name}: return the loss as a Python float "
                f"(loss.item()), got {type(got).__name__}."
            )
        if abs(got - want) > 1e-5:
            raise ExerciseFailed(
                f"{name}: step {step + 1} returned loss {got:.5f}, expected "
                f"{want:.5f} (F.cross_entropy on the logits, before the update)."
            )
        for (pname, p), q in zip(model.named_parameters(), reference.parameters()):
            if not torch.allclose(p, q, atol=1e-6):
                hint = (
                    "Gradients piled up from the previous step: call "
                    "optimizer.zero_grad() first."
                    if step
                    else "Call loss.backward() then optimizer.step()."
                )
                raise ExerciseFailed(
                    f"{name}: after step {step + 1} parameter {pname!r} "
                    f"differs from the reference. {hint}"
                )
    if F.cross_entropy(model(images), labels).item() >= want:
        raise ExerciseFailed(f"{name}: the loss did not go down after two steps.")
    passed(
        name, "zero_grad, forward, loss, backward, step: the loop every lab builds on."
    )
