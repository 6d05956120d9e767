"""Do the exercise checks give the specific hint for each classic mistake?"""

import pytest
import torch
import torch.nn.functional as F
from torchvision import transforms

from labkit import checks, data
from labkit.checks import environment, single_device


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


def test_device_choice_catches_missing_brackets():
    """Is `is_available` without () caught even on a GPU machine?"""
    _fails(
        single_device.device_choice,
        lambda: torch.device("cuda" if torch.cuda.is_available else "cpu"),
        "always truthy",
    )
    _fails(single_device.device_choice, lambda: "cpu", "return a torch.device")


def test_allreduce_single_gpu_hint():
    """Is a nonzero time for one GPU explained?"""
    _fails(
        environment.allreduce_time,
        lambda n, w, link, b, a: 2 * (w - 1) / w * n * b / (link * 1e9) + (w == 1),
        "nothing to synchronise",
    )


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


def test_numbers_of_any_type_pass(capsys):
    """Are a NumPy integer and a one-element tensor judged by their value?"""
    import numpy as np

    _passes(environment.count_parameters,
            lambda m: np.int64(sum(p.numel() for p in m.parameters() if p.requires_grad)),
            capsys)
    _passes(environment.training_memory,
            lambda n, b, a: torch.tensor(16 * n * b // 4 + a, dtype=torch.float64),
            capsys)


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
