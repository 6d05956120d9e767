"""The course's reference models.

Taught in: lab 01 (``small_cnn``, trained on one device); labs 04-05 split ``deep_mlp``
across devices. Both are ``nn.Sequential`` so that slicing keeps parameter names.
"""

from torch import nn

from labkit.messages import _

__all__ = ["small_cnn", "deep_mlp", "count_parameters", "max_difference"]


def small_cnn() -> nn.Sequential:
    """Return a 0.1 M-parameter CNN: fast on 2 cores, 99% on MNIST."""
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # (B,16,14,14)
        nn.Conv2d(16, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # (B,32,7,7)
        nn.Flatten(),  # (B,1568)
        nn.Linear(32 * 7 * 7, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def deep_mlp(
    num_layers: int = 8, width: int = 512, num_classes: int = 10
) -> nn.Sequential:
    """Return Flatten + ``num_layers`` Linear layers (ReLU between): easy to cut up.

    Every hidden layer has the same cost, so equal-sized slices make balanced stages.
    """
    if num_layers < 2:
        raise ValueError(
            _("deep_mlp needs at least 2 layers (in and out), got {num_layers}."
              ).format(num_layers=num_layers)
        )
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(28 * 28, width), nn.ReLU()]
    for _hidden in range(num_layers - 2):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def count_parameters(model: nn.Module) -> int:
    """Return the number of trainable parameters (gradients and Adam states too)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def max_difference(want: dict, got: dict) -> float:
    """Return the largest absolute gap between two {name: tensor} dicts.

    For parameters, gradients or state_dicts, on any devices and dtypes; raises
    ValueError naming what is missing or unexpected when the names differ.
    """
    if want.keys() != got.keys():
        missing, extra = (
            sorted(want.keys() - got.keys()),
            sorted(got.keys() - want.keys()),
        )
        raise ValueError(
            _("The dicts hold different names: missing {missing}, unexpected "
              "{extra}.").format(missing=missing, extra=extra)
        )
    return max(
        (want[k].detach().cpu().double() - got[k].detach().cpu().double())
        .abs()
        .max()
        .item()
        for k in want
    )
