"""Shared fixtures: quick mode, no network, and private copies of the MNIST files."""

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Tests never download and always run the quick variants.
os.environ.setdefault("LABKIT_QUICK", "1")
os.environ.setdefault("LABKIT_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "agg")


def _shipped_raw() -> Path:
    from labkit import data

    raw = data.data_root() / "MNIST" / "raw"
    if not all(
        (raw / f"{stem}-ubyte.gz").exists()
        for stem in (
            "train-images-idx3",
            "train-labels-idx1",
            "t10k-images-idx3",
            "t10k-labels-idx1",
        )
    ):
        pytest.fail(
            f"MNIST .gz files are not in {raw}: run `labkit data prepare` "
            "(make test does) or copy them there."
        )
    return raw


@pytest.fixture
def mnist_root(tmp_path) -> Path:
    """A fresh data folder holding copies of the four original MNIST .gz files."""
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for gz in _shipped_raw().glob("*.gz"):
        shutil.copy(gz, raw / gz.name)
    return tmp_path


# Notebook hardware: nbval runs every cell of solutions/*.ipynb; a notebook whose
# metadata.labkit asks for more GPUs than this machine has is skipped, saying why.


def _hardware_skip_reason(path: Path, found: int) -> str | None:
    """Return why a notebook cannot run with ``found`` GPUs, or None when it can."""
    import json

    needs = json.loads(path.read_text()).get("metadata", {}).get("labkit", {})
    min_gpus, cpu_ok = int(needs.get("min_gpus", 0)), bool(needs.get("cpu_ok", True))
    if min_gpus > found:
        return (
            f"{path.name} needs {min_gpus} GPU(s) (metadata.labkit.min_gpus), "
            f"this machine has {found}"
        )
    if not cpu_ok and found == 0:
        return (
            f"{path.name} is GPU-only (metadata.labkit.cpu_ok is false), no GPU found"
        )
    return None


def pytest_collection_modifyitems(config, items):
    """Skip the nbval cells of notebooks that need more GPUs than torch can see."""
    notebooks = {Path(str(item.path)) for item in items if item.path.suffix == ".ipynb"}
    if not notebooks:
        return
    import torch

    found = torch.cuda.device_count()  # NVML only: does not initialise CUDA here
    reasons = {path: _hardware_skip_reason(path, found) for path in notebooks}
    for item in items:
        reason = reasons.get(Path(str(item.path)))
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
