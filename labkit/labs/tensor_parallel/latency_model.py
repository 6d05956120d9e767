"""The alpha-beta model of one request's latency: one device, a layer-wise split, a
tensor-parallel split.

Taught in: lab 08 (model-parallel inference latency). A message of n bytes costs
alpha + n / beta: alpha, the fixed latency of one message or collective; beta, the
bandwidth. A ring all-reduce over N devices moves 2(N-1)/N of the bytes (lab 00). A
layer costs the larger of reading its weights and doing its arithmetic (the roofline:
with one request, reading the weights wins). Lab 06 fits alpha and beta from its own
measurements; until then ``LINKS`` holds published figures, each with its source, and
``fit_link`` fits this machine's from the lab's own timings.

Units: seconds, bytes, bytes/s (1 GB/s = 1e9 bytes/s), FLOP/s.
"""

import dataclasses
from dataclasses import dataclass

from labkit.messages import N_, Said, _

__all__ = ["Link", "Device", "Layers", "LINKS", "DEVICES", "GPT3", "SPLITS",
           "transformer", "layer_seconds", "request_seconds", "fit_link",
           "measured_name"]

SPLITS = ("single", "layerwise", "tensor")


@dataclass(frozen=True)
class Link:
    """A link between devices: ``alpha_s`` per message, ``bytes_per_s`` one way."""

    name: str
    alpha_s: float
    bytes_per_s: float
    source: str = ""

    def message_seconds(self, nbytes: float) -> float:
        """Return the time of one message of ``nbytes`` from one device to another."""
        return self.alpha_s + nbytes / self.bytes_per_s

    def allreduce_seconds(self, nbytes: float, n: int) -> float:
        """Return the time of a ring all-reduce of ``nbytes`` over ``n`` devices.

        alpha once (NCCL's measured small-message latency is for the whole
        collective), plus 2(n-1)/n of the bytes at the link's bandwidth (``bytes_per_s``
        is NCCL's "bus bandwidth"). Nothing to do on one device.
        """
        if n == 1:
            return 0.0
        return self.alpha_s + 2 * (n - 1) / n * nbytes / self.bytes_per_s


@dataclass(frozen=True)
class Device:
    """One accelerator: memory bandwidth, peak arithmetic, memory size."""

    name: str
    memory_bytes_per_s: float
    flops_per_s: float
    memory_bytes: float
    source: str = ""


@dataclass(frozen=True)
class Layers:
    """What one request goes through: ``num_layers`` equal layers.

    Per layer: ``weight_bytes`` to read, ``flops`` to do, ``activation_bytes`` leaving
    it, and ``allreduces`` a tensor-parallel split needs (Megatron block: 2, one after
    attention, one after the MLP; a bare MLP: 1).
    """

    num_layers: int
    weight_bytes: float
    flops: float
    activation_bytes: float
    allreduces: int = 2

    @property
    def params(self) -> float:
        """Parameters, if the weights are 2-byte values (fp16/bf16)."""
        return self.num_layers * self.weight_bytes / 2


def transformer(num_layers: int, hidden: int, tokens: int = 1,
                bytes_per_value: int = 2) -> Layers:
    """Return a GPT-style stack: 12 h^2 weights per layer (4 h^2 attention, 8 h^2 MLP).

    ``tokens`` processed at once (1 = one decoding step); 2 FLOPs per weight per token.
    Embeddings and attention over the KV cache are left out (small at this scale).
    """
    weights = 12 * hidden**2
    return Layers(num_layers, weights * bytes_per_value, 2 * weights * tokens,
                  tokens * hidden * bytes_per_value, allreduces=2)


def layer_seconds(layers: Layers, device: Device, n: int = 1) -> float:
    """Return one layer's time when ``n`` devices each hold 1/n of it (roofline)."""
    return max(layers.weight_bytes / n / device.memory_bytes_per_s,
               layers.flops / n / device.flops_per_s)


def _check(n: int, split: str) -> None:
    if split not in SPLITS:
        raise ValueError(_("Unknown split {split!r}: choose one of {choices}.").format(
            split=split, choices=", ".join(SPLITS)))
    if not isinstance(n, int) or n < 1:
        raise ValueError(_("n (devices) must be a positive integer, got {n!r}.").format(
            n=n))


def request_seconds(layers: Layers, device: Device, link: Link, n: int,
                    split: str) -> float:
    """Return one request's latency on ``n`` devices, split ``split`` (see SPLITS).

    The request starts on device 0 and its answer must end there. "layerwise": the
    devices work one after the other (the whole compute), and the activations make n
    hops (n-1 cuts, then back to device 0). "tensor": device 0 sends the request to
    the others (one message), then every layer runs 1/n on each device and ends with
    ``layers.allreduces`` all-reduces; the answer is then on every device.
    """
    _check(n, split)
    whole = layers.num_layers * layer_seconds(layers, device, 1)
    if split == "single" or n == 1:
        return whole
    if split == "layerwise":
        return whole + n * link.message_seconds(layers.activation_bytes)
    reduce = link.allreduce_seconds(layers.activation_bytes, n)
    per_layer = layer_seconds(layers, device, n) + layers.allreduces * reduce
    return link.message_seconds(layers.activation_bytes) + layers.num_layers * per_layer


def fit_link(nbytes: list, seconds: list, name: str, source: str = "") -> Link:
    """Fit alpha and beta to measured (bytes, seconds) by least squares: a Link.

    Needs two sizes or more; a fitted bandwidth that is not positive (timings too
    noisy to see it) is refused with the numbers.
    """
    if len(nbytes) != len(seconds) or len(set(nbytes)) < 2:
        raise ValueError(_("fit_link needs the same number of sizes and times, at "
                           "least two distinct sizes; got sizes {sizes}, times "
                           "{times}.").format(sizes=nbytes, times=seconds))
    count = len(nbytes)
    mean_x, mean_y = sum(nbytes) / count, sum(seconds) / count
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(nbytes, seconds))
             / sum((x - mean_x) ** 2 for x in nbytes))
    if slope <= 0:
        raise ValueError(_("The times {times} do not grow with the sizes {sizes}: no "
                           "bandwidth to fit (too noisy? measure larger sizes)."
                           ).format(times=seconds, sizes=nbytes))
    return Link(name, max(mean_y - slope * mean_x, 0.0), 1 / slope, source)


# ---------------------------------------------------------------- published figures


_A100 = Said(N_("NVIDIA A100 datasheet: 80 GB SXM4, HBM2e 2,039 GB/s, 312 TFLOP/s "
                "dense bf16/fp16 (nvidia-smi: 81,920 MiB)"))
_H200 = Said(N_("NVIDIA H200 datasheet: HBM3e 4.8 TB/s, 989 TFLOP/s dense bf16, "
                "141 GB"))
DEVICES = {
    "A100 80GB": Device("A100 80GB", 2.039e12, 312e12, 80 * 2**30, _A100),
    "H200": Device("H200", 4.8e12, 989e12, 141e9, _H200),
}

LINKS = {
    "NVLink 3 (DGX A100)": Link(
        "NVLink 3 (DGX A100)", 10e-6, 200e9, Said(N_(
            "alpha: NCCL all-reduce of 32 B on 2 A100-SXM4 took 10.1 us "
            "(NVIDIA/nccl#583); beta: 8 A100 all_reduce_perf bus bandwidth ~200 GB/s "
            "(NVIDIA/nccl-tests#149); line rate 300 GB/s each way"))),
    "NVLink 4 (H100/H200)": Link(
        "NVLink 4 (H100/H200)", 6e-6, 370e9, Said(N_(
            "alpha: ~6 us all-reduce on 2 H100 with NVLink SHARP (NVIDIA/nccl#1259); "
            "beta: NCCL's effective NVLink bandwidth ~370 GB/s of the 450 GB/s line "
            "rate (NVIDIA/nccl-tests#212)"))),
    "InfiniBand HDR (between DGX A100)": Link(
        "InfiniBand HDR (between DGX A100)", 20e-6, 25e9, Said(N_(
            "beta: 200 Gbit/s = 25 GB/s per GPU (one HDR NIC per GPU in a DGX A100), "
            "line rate; alpha: an ASSUMPTION of the usual order (tens of us between "
            "nodes), not a measurement"))),
}

# GPT-3 family (Brown et al. 2020, Table 2.1): name -> (layers, hidden size).
GPT3 = {
    "GPT-3 Small (125M)": (12, 768),
    "GPT-3 XL (1.3B)": (24, 2048),
    "GPT-3 6.7B": (32, 4096),
    "GPT-3 13B": (40, 5140),
    "GPT-3 175B": (96, 12288),
}


# ---------------------------------------------------------------- how robust a verdict is


def derated(device: Device, memory_fraction: float = 1.0,
            flops_fraction: float = 1.0) -> Device:
    """Return ``device`` reaching only these fractions of its peak figures.

    The roofline assumes 100 % of HBM bandwidth; real decoding kernels reach 60-90 %.
    """
    return dataclasses.replace(
        device, name=_("{device} at {fraction:.0%} of HBM").format(
            device=device.name, fraction=memory_fraction),
        memory_bytes_per_s=device.memory_bytes_per_s * memory_fraction,
        flops_per_s=device.flops_per_s * flops_fraction)


def with_overhead(link: Link, extra_s: float) -> Link:
    """Return ``link`` whose every message and all-reduce costs ``extra_s`` more
    (kernel launches, a larger alpha at 8 GPUs than the 2-GPU figure)."""
    return dataclasses.replace(link, name=f"{link.name} + {extra_s * 1e6:g} us",
                               alpha_s=link.alpha_s + extra_s)


def largest_under(budget_s: float, device: Device, link: Link, n: int,
                  split: str = "tensor", layers_per_hidden: int = 128) -> Layers:
    """Return the largest GPT-3-shaped stack (layers = h / ``layers_per_hidden``, h a
    multiple of 128) whose one decoding step takes under ``budget_s``."""
    fits = [transformer(h // layers_per_hidden, h) for h in range(1024, 32769, 128)
            if request_seconds(transformer(h // layers_per_hidden, h), device, link, n,
                               split) < budget_s]
    if not fits:
        raise ValueError(_("No model of hidden size >= 1024 fits {budget_ms:g} ms."
                           ).format(budget_ms=budget_s * 1e3))
    return max(fits, key=lambda layers: layers.params)


_MEASURED = {"allreduce": N_("{backend} all-reduce (here)"),
             "message": N_("{backend} message (here)")}


def measured_name(kind: str, backend: str) -> str:
    """The name of a link fitted to this machine's timings (``kind``: "allreduce" or
    "message"), in the learner's language; lab 08's fit of its own backend."""
    return _(_MEASURED[kind]).format(backend=backend)
