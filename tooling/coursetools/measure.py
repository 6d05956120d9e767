"""Measure a lab's compute: run its solution in full (and quick) mode; keep the seconds.

Taught in: nowhere (instructor tooling: ``labkit measure-labs``). The figure, the
machine and its mean load go into the notebook's ``metadata.labkit.measured``;
``coursetools.times`` reads them into the lab's Time sentence, and says so when the
machine was shared with other work while it ran.
"""

import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

import nbformat

__all__ = ["machine", "measure"]


def machine() -> dict:
    """Describe this machine as a measurement records it: where (cores or GPUs), the
    CPU model and the torch version."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in
                 Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count())
    gpus = torch.cuda.device_count()
    where = (f"{gpus} × {torch.cuda.get_device_name(0)}" if gpus
             else f"{cores} CPU cores")
    return {"on": where, "cpu": cpu, "cores": cores,
            "torch": torch.__version__.split("+")[0]}


def _run_seconds(path: Path, quick: bool, timeout: float) -> float:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    saved = os.environ.get("LABKIT_QUICK")
    os.environ["LABKIT_QUICK"] = "1" if quick else "0"
    try:
        with tempfile.TemporaryDirectory(prefix="labkit-measure-") as folder:
            start = time.perf_counter()
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": folder}}).execute()
            return time.perf_counter() - start
    finally:
        if saved is None:
            os.environ.pop("LABKIT_QUICK", None)
        else:
            os.environ["LABKIT_QUICK"] = saved


def measure(path, timeout: float = 3600, quick: bool = False) -> dict:
    """Run a solution notebook in full mode (and in quick mode when asked); store and
    return the seconds, with the machine and its mean load while it ran (a busy
    machine is said to be busy in the header)."""
    path = Path(path)
    before = os.getloadavg()[0]
    full = _run_seconds(path, quick=False, timeout=timeout)
    load = (before + os.getloadavg()[0]) / 2
    quick_s = (round(_run_seconds(path, quick=True, timeout=timeout), 1) if quick
               else None)
    measured = {"full_mode_s": round(full, 1), "quick_mode_s": quick_s,
                "load": round(load, 1), **machine(),
                "date": datetime.date.today().isoformat()}
    nb = nbformat.read(path, as_version=4)
    nb.metadata.setdefault("labkit", {})["measured"] = measured
    nbformat.write(nb, path)
    return measured
