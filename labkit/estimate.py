"""Estimates of training memory and gradient-sync time, and a memory measurement.

Taught in: lab 00 (does it fit? how long does all-reduce take?); lab 04 reuses
``training_memory_bytes`` on a model that does not fit. These are the reference
answers the lab-00 exercises are checked against.
"""

import torch
import torch.nn.functional as F

from labkit.messages import N_, _

__all__ = [
    "training_memory_bytes",
    "ring_allreduce_bytes",
    "allreduce_seconds",
    "measure_training_bytes",
    "kind_name",
    "GBIT_ETHERNET",
]

# Usable one-way bandwidth in GB/s (bytes, not bits: 10 Gbit/s = 1.25 GB/s).
GBIT_ETHERNET = {
    "10 GbE": 1.25,
    "25 GbE": 3.125,
    "100 GbE / IB EDR": 12.5,
    "IB NDR 400": 50.0,
    "PCIe 5 x16": 63.0,
    "NVLink 4 (H100/H200)": 450.0,
}


def training_memory_bytes(
    num_params: int, bytes_per_value: int = 4, activation_bytes: int = 0
) -> int:
    """Return bytes to train with Adam: weights, gradients, 2 Adam states, activations.

    Every copy in the same precision (fp32: 16 bytes per parameter). Mixed precision
    with fp32 master weights also lands near 16 (ZeRO paper: 2 + 2 + 12).
    """
    return num_params * bytes_per_value * 4 + activation_bytes


def ring_allreduce_bytes(
    num_params: int, world_size: int, bytes_per_value: int = 4
) -> float:
    """Return the bytes each GPU sends in a ring all-reduce: 2(n-1)/n of gradients."""
    if world_size < 1:
        raise ValueError(_("world_size must be at least 1, got {world_size}.").format(
            world_size=world_size))
    return 2 * (world_size - 1) / world_size * num_params * bytes_per_value


def allreduce_seconds(
    num_params: int,
    world_size: int,
    link_gbytes_per_s: float,
    bytes_per_value: int = 4,
    latency_s: float = 0.0,
) -> float:
    """Return the time of one ring all-reduce of the gradients: latency + bandwidth.

    A ring takes 2(n-1) steps (reduce-scatter, then all-gather); each step pays the
    link's latency ``latency_s`` once, and each GPU sends 2(n-1)/n of the bytes in
    all: t = 2(n-1) * latency + 2(n-1)/n * bytes / bandwidth (lab 06 fits both).
    """
    if link_gbytes_per_s <= 0:
        raise ValueError(
            _("link bandwidth must be positive, got {bandwidth} GB/s.").format(
                bandwidth=link_gbytes_per_s)
        )
    steps = 2 * (world_size - 1)
    return steps * latency_s + ring_allreduce_bytes(
        num_params, world_size, bytes_per_value
    ) / (link_gbytes_per_s * 1e9)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_training_bytes(model, images, labels) -> dict[str, int]:
    """Run one Adam step on ``model`` and count the bytes each kind of tensor holds.

    Activations are the tensors autograd saves for the backward pass (parameters and
    repeats excluded), counted with ``torch.autograd.graph.saved_tensors_hooks``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    seen = {p.untyped_storage().data_ptr() for p in params}
    activations = []

    def pack(tensor):
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in seen:
            seen.add(pointer)
            activations.append(tensor.untyped_storage().nbytes())
        return tensor

    optimizer = torch.optim.Adam(params)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    states = [
        v
        for state in optimizer.state.values()
        for v in state.values()
        if torch.is_tensor(v) and v.dim() > 0
    ]  # skip Adam's scalar step counter
    return {
        "weights": _nbytes(params),
        "gradients": _nbytes(p.grad for p in params),
        "adam states": _nbytes(states),
        "activations": sum(activations),
    }


# The kinds measure_training_bytes counts; the keys stay English (code compares them).
_KIND_NAMES = {"weights": N_("weights"), "gradients": N_("gradients"),
               "adam states": N_("Adam states"), "activations": N_("activations")}


def kind_name(kind: str) -> str:
    """The name of a kind ``measure_training_bytes`` counts, in the learner's language.

    Taught in: lab 00 (the bytes of one training step, printed by kind).
    """
    return _(_KIND_NAMES.get(kind, kind))
