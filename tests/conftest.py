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
# metadata.labkit asks for more GPUs than this machine has is skipped, saying why
# (the rule is labkit.course.hardware_skip_reason, shared with env/gpu_check.py).


def pytest_collection_modifyitems(config, items):
    """Skip the nbval cells of notebooks that need more GPUs than torch can see."""
    notebooks = {Path(str(item.path)) for item in items if item.path.suffix == ".ipynb"}
    if not notebooks:
        return
    import torch

    from labkit.course import hardware_skip_reason

    found = torch.cuda.device_count()  # NVML only: does not initialise CUDA here
    reasons = {path: hardware_skip_reason(path, found) for path in notebooks}
    for item in items:
        reason = reasons.get(Path(str(item.path)))
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


# GPU tests: marked `gpu`, skipped here when no GPU is seen. In the GPU lane
# (LABKIT_REQUIRE_GPU=1) such a skip means the GPUs were not found: a failure.

REQUIRE_GPU_ENV = "LABKIT_REQUIRE_GPU"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA GPUs (skipped without them)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Turn the skip of a `gpu` test into a failure when GPUs are required."""
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and item.get_closest_marker("gpu")
            and os.environ.get(REQUIRE_GPU_ENV) == "1"):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} was skipped, but {REQUIRE_GPU_ENV}=1: this "
                           "lane must run every GPU test (are the GPUs visible?)")
