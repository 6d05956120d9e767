"""Lab 01's checks: does each classic mistake get its specific hint, and every
correct idiom pass?"""

import pytest
import torch
import torch.nn.functional as F
from torchvision import transforms

from labkit import checks, data
from labkit.labs.single_device import checks as single_device


def _fails(check, fn, hint):
    with pytest.raises(checks.ExerciseFailed, match=hint):
        check(fn)


def test_device_choice_catches_missing_brackets():
    """Is `is_available` without () caught even on a GPU machine?"""
    _fails(
        single_device.device_choice,
        lambda: torch.device("cuda" if torch.cuda.is_available else "cpu"),
        "always truthy",
    )
    _fails(single_device.device_choice, lambda: "cpu", "return a torch.device")


def test_transform_hints():
    """Are ToTensor without () and a missing Normalize caught?"""
    _fails(
        single_device.mnist_transform,
        lambda: transforms.Compose([transforms.ToTensor]),
        "ToTensor without",
    )
    _fails(
        single_device.mnist_transform,
        lambda: transforms.ToTensor(),
        "black pixel should become",
    )
    assert data.MEAN and data.STD


def test_minibatch_hints():
    """Are unshuffled, dropped-last and misaligned batches caught?"""

    def in_order(images, labels, bs, gen):
        for s in range(0, len(labels), bs):
            yield images[s : s + bs], labels[s : s + bs]

    def drop_last(images, labels, bs, gen):
        order = torch.randperm(len(labels), generator=gen)
        for s in range(0, len(labels) - bs + 1, bs):
            yield images[order[s : s + bs]], labels[order[s : s + bs]]

    def misaligned(images, labels, bs, gen):
        order = torch.randperm(len(labels), generator=gen)
        for s in range(0, len(labels), bs):
            yield images[order[s : s + bs]], labels[s : s + bs]

    _fails(single_device.minibatches, in_order, "shuffled")
    _fails(single_device.minibatches, drop_last, r"\[4, 4, 2\]")
    _fails(single_device.minibatches, misaligned, "out of step")


def test_train_step_hints():
    """Are a missing zero_grad and a tensor return caught?"""

    def no_zero_grad(model, images, labels, optimizer):
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    def returns_tensor(model, images, labels, optimizer):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss

    _fails(single_device.train_step, no_zero_grad, "zero_grad")
    _fails(single_device.train_step, returns_tensor, "Python float")


def _passes(check, fn, capsys):
    check(fn)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("choose", [
    lambda: torch.device("cuda:0" if torch.cuda.is_available() else "cpu"),
    lambda: torch.device("cuda" if torch.cuda.device_count() > 0 else "cpu"),
    lambda: (torch.accelerator.current_accelerator(check_available=True)
             or torch.device("cpu")),
])
def test_device_choice_in_other_idioms(choose, capsys):
    """Do 'cuda:0', device_count() and torch.accelerator pass as well?"""
    _passes(single_device.device_choice, choose, capsys)


def test_transform_v2_passes(capsys):
    """Does a transform written with torchvision's transforms.v2 pass?"""
    from torchvision.transforms import v2

    _passes(single_device.mnist_transform,
            lambda: v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                v2.Normalize([data.MEAN], [data.STD])]), capsys)


def test_minibatches_with_a_generator_on_the_data_device(capsys):
    """Does a permutation drawn with randperm(device=...) and split() pass?"""
    def by_split(images, labels, batch_size, generator=None):
        order = torch.randperm(len(labels), generator=generator, device=labels.device)
        for index in order.split(batch_size):
            yield images.index_select(0, index), labels.index_select(0, index)

    _passes(single_device.minibatches, by_split, capsys)
