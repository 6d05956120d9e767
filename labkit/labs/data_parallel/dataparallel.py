"""Plumbing for data parallelism in one process: where the replicas go, where
``nn.DataParallel`` wants its module, exact float32 for equality proofs, and the
per-GPU memory of an ``nn.DataParallel`` step.

Taught in: lab 02. The data-parallel step itself (replicate, scatter, the replicas in
threads, the weighted gradient average, the step) is the learner's: it lives in the
lab's ``%%writefile`` cells, and ``labkit.checks.data_parallel`` checks it.
"""

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from labkit.messages import _

__all__ = ["replica_devices", "exact_float32", "float32_precisions",
           "dataparallel_memory"]


def replica_devices(num_replicas: int, verbose: bool = True) -> list[torch.device]:
    """Return one device per replica: distinct GPUs if enough, else the CPU."""
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(
            _("num_replicas must be a positive integer, got {num_replicas!r}."
              ).format(num_replicas=num_replicas)
        )
    found = torch.cuda.device_count()
    if found >= num_replicas:
        devices = [torch.device("cuda", i) for i in range(num_replicas)]
        why = _("{found} GPU(s) found: one replica per GPU").format(found=found)
    else:
        devices = [torch.device("cpu")] * num_replicas
        why = _(
            "{found} GPU(s) found, {num_replicas} replicas wanted: all replicas are "
            "copies on the CPU (same arithmetic, no speed-up)"
        ).format(found=found, num_replicas=num_replicas)
    if verbose:
        print(_("Replicas on {devices} - {why}").format(
            devices=[str(d) for d in devices], why=why))
    return devices


def _tf32_switches() -> dict:
    """Return {name: (get, set)} for this torch's TF32 switches.

    torch >= 2.9: ``fp32_precision`` ("ieee" = plain float32, "tf32") for cuBLAS
    matmuls and cuDNN convolutions and RNNs; older torch: the ``allow_tf32`` flags
    (deprecated since 2.9, and a mix of the two APIs makes torch raise).
    """
    backends = torch.backends
    if hasattr(backends.cudnn, "conv"):   # the fp32_precision API
        owners = {"matmul": backends.cuda.matmul, "conv": backends.cudnn.conv,
                  "rnn": backends.cudnn.rnn}
        return {name: (lambda o=o: o.fp32_precision,
                       lambda value, o=o: setattr(o, "fp32_precision", value))
                for name, o in owners.items()}
    owners = {"matmul": backends.cuda.matmul, "cudnn": backends.cudnn}
    return {name: (lambda o=o: o.allow_tf32,
                   lambda value, o=o: setattr(o, "allow_tf32", value))
            for name, o in owners.items()}


def float32_precisions() -> dict:
    """Return the TF32 switches now: "ieee"/"tf32" (torch >= 2.9) or allow_tf32."""
    return {name: get() for name, (get, _) in _tf32_switches().items()}


def module_device() -> torch.device:
    """Return where ``nn.DataParallel`` wants the module: cuda:0 with GPUs, else CPU.

    DataParallel takes every visible GPU (``device_ids`` defaults to all of them) and
    refuses a module that is not on ``device_ids[0]``, even with one GPU; without
    GPUs it just calls the module on the CPU. Not ``replica_devices``: on 1-2 GPUs
    the lab's 3 replicas are on the CPU, but DataParallel still wants cuda:0.
    """
    return torch.device("cuda", 0) if torch.cuda.device_count() else torch.device("cpu")


@contextmanager
def exact_float32():
    """Run the block with TF32 off (cuDNN convolutions and matmuls), then restore.

    On NVIDIA GPUs since Ampere, cuDNN runs float32 convolutions in TF32 (a 10-bit
    mantissa) by default, so two ways of computing one gradient differ by ~1e-3
    instead of ~1e-7: too much for an equality proof. On a CPU nothing changes.
    Uses ``torch.backends.cuda.matmul.fp32_precision`` and
    ``torch.backends.cudnn.conv/rnn.fp32_precision = "ieee"`` (torch >= 2.9), else the
    older ``allow_tf32`` flags; inside the block read them with
    ``float32_precisions()`` (the old getters refuse a mix of the two APIs).
    """
    switches = _tf32_switches()
    saved = {name: get() for name, (get, _) in switches.items()}
    off = "ieee" if "conv" in switches else False
    try:
        for _, put in switches.values():
            put(off)
        yield
    finally:
        for name, (_, put) in switches.items():
            put(saved[name])


def dataparallel_memory(model: nn.Module, batch: int = 512) -> list[int] | None:
    """Return each GPU's peak bytes in a DataParallel step; None without 2 GPUs."""
    count = torch.cuda.device_count()
    if count < 2:
        print(
            _("{count} GPU(s): nn.DataParallel has nothing to spread; no per-GPU "
              "memory to measure here.").format(count=count)
        )
        return None
    wrapped = nn.DataParallel(model.to("cuda:0"))
    optimizer = torch.optim.Adam(wrapped.parameters())
    for i in range(count):
        torch.cuda.reset_peak_memory_stats(i)
    images = torch.randn(batch, 1, 28, 28, device="cuda:0")
    labels = torch.randint(0, 10, (batch,), device="cuda:0")
    loss = F.cross_entropy(wrapped(images), labels)
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    return [torch.cuda.max_memory_allocated(i) for i in range(count)]
