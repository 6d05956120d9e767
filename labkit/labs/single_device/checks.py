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
from labkit.checks._solved import has_passed, solved
from labkit.messages import _

__all__ = ["use_reference", "solved", "has_passed",
           "device_choice", "mnist_transform", "minibatches", "train_step"]


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
            raise ExerciseFailed(_(
                "{exercise}: return a torch.device (torch.device('cuda') or "
                "torch.device('cpu')), got {got!r}.").format(exercise=name, got=got))
        if got.type != want:
            hint = (
                _("`torch.cuda.is_available` without () is a function object, and a "
                  "function is always truthy: call it.")
                if want == "cpu"
                else _("When CUDA is available, return torch.device('cuda') (or "
                       "'cuda:0').")
            )
            raise ExerciseFailed(_(
                "{exercise}: with CUDA available={available} expected "
                "{want!r}, got {got!r}. {hint}"
            ).format(exercise=name, available=available, want=want, got=got.type,
                     hint=hint))
    passed(name, _("The seed's bug (no brackets) would have picked CUDA on a laptop."))


def mnist_transform(fn) -> None:
    """Check ``fn()`` turns a PIL 28x28 image into a normalized (1, 28, 28) tensor."""
    name = "mnist_transform"
    pixels = np.zeros((28, 28), dtype=np.uint8)
    pixels[0, 0] = 255
    transform = attempt(name, fn)
    try:
        out = transform(Image.fromarray(pixels, mode="L"))
    except TypeError as err:
        raise ExerciseFailed(_(
            "{exercise}: applying your transform raised TypeError ({error}). "
            "Did you write transforms.ToTensor without ()? Compose "
            "needs instances: transforms.ToTensor()."
        ).format(exercise=name, error=err)) from None
    if (
        not isinstance(out, torch.Tensor)
        or out.shape != (1, 28, 28)
        or out.dtype != torch.float32
    ):
        raise ExerciseFailed(_(
            "{exercise}: expected a float32 tensor of shape (1, 28, 28), got "
            "{dtype} {shape}."
        ).format(exercise=name, dtype=getattr(out, "dtype", type(out)),
                 shape=getattr(out, "shape", "")))
    want_black, want_white = -data.MEAN / data.STD, (1 - data.MEAN) / data.STD
    if not (
        abs(out[0, 1, 1] - want_black) < 1e-4 and abs(out[0, 0, 0] - want_white) < 1e-4
    ):
        raise ExerciseFailed(_(
            "{exercise}: a black pixel should become {want_black:.4f} and a "
            "white one {want_white:.4f}, got {got_black:.4f} and "
            "{got_white:.4f}. Normalize((MEAN,), (STD,)) after "
            "ToTensor(), with data.MEAN and data.STD."
        ).format(exercise=name, want_black=want_black, want_white=want_white,
                 got_black=out[0, 1, 1], got_white=out[0, 0, 0]))
    passed(name, _("Both brackets in place; pixels are centred and scaled."))


def minibatches(fn) -> None:
    """Check ``fn(images, labels, batch_size, generator)`` yields shuffled batches."""
    name = "iterate_minibatches"
    labels = torch.arange(10)
    images = labels.float().view(10, 1, 1, 1).expand(10, 1, 2, 2).clone()
    gen = torch.Generator().manual_seed(0)
    epochs = [list(attempt(name, fn, images, labels, 4, gen)) for _epoch in range(2)]
    sizes = [len(y) for _x, y in epochs[0]]
    if sizes != [4, 4, 2]:
        raise ExerciseFailed(_(
            "{exercise}: 10 samples in batches of 4 should give sizes "
            "[4, 4, 2] (keep the last, short batch), got {sizes}."
        ).format(exercise=name, sizes=sizes))
    for batches in epochs:
        seen = torch.cat([y for _x, y in batches])
        if sorted(seen.tolist()) != list(range(10)):
            raise ExerciseFailed(_(
                "{exercise}: each epoch must visit every sample once, saw "
                "{seen}. Slice one permutation, don't sample."
            ).format(exercise=name, seen=seen.tolist()))
        if any(not torch.equal(x[:, 0, 0, 0].long(), y) for x, y in batches):
            raise ExerciseFailed(_(
                "{exercise}: images and labels went out of step: index both "
                "with the same indices."
            ).format(exercise=name))
    orders = [torch.cat([y for _x, y in b]).tolist() for b in epochs]
    if orders[0] == list(range(10)) or orders[0] == orders[1]:
        raise ExerciseFailed(_(
            "{exercise}: the order should be shuffled, and differ between "
            "epochs; got {orders}. Draw torch.randperm(n, generator=...) "
            "on every call."
        ).format(exercise=name, orders=orders))
    passed(name, _("One gather per batch, no per-sample Python: that is the fast "
                   "path."))


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
            raise ExerciseFailed(_(
                "{exercise}: return the loss as a Python float "
                "(loss.item()), got {type_name}."
            ).format(exercise=name, type_name=type(got).__name__))
        if abs(got - want) > 1e-5:
            raise ExerciseFailed(_(
                "{exercise}: step {step} returned loss {got:.5f}, expected "
                "{want:.5f} (F.cross_entropy on the logits, before the update)."
            ).format(exercise=name, step=step + 1, got=got, want=want))
        for (pname, p), q in zip(model.named_parameters(), reference.parameters()):
            if not torch.allclose(p, q, atol=1e-6):
                hint = (
                    _("Gradients piled up from the previous step: call "
                      "optimizer.zero_grad() first.")
                    if step
                    else _("Call loss.backward() then optimizer.step().")
                )
                raise ExerciseFailed(_(
                    "{exercise}: after step {step} parameter {parameter!r} "
                    "differs from the reference. {hint}"
                ).format(exercise=name, step=step + 1, parameter=pname, hint=hint))
    if F.cross_entropy(model(images), labels).item() >= want:
        raise ExerciseFailed(_("{exercise}: the loss did not go down after two "
                               "steps.").format(exercise=name))
    passed(
        name, _("zero_grad, forward, loss, backward, step: the loop every lab builds "
                "on.")
    )
