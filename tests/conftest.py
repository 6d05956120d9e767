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
# The launcher's helper stays up for the whole run: tests that count processes must
# not see it stop after a minute idle (tests/runtime/test_crowding.py tests that on purpose).
os.environ.setdefault("LABKIT_HELPER_IDLE_S", "0")


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
# (the rule is coursetools.notebooks.hardware_skip_reason, shared with env/gpu_check.py).


# The longest files first: make test's workers take one file at a time in this
# order (pytest-xdist --dist loadfile --no-loadscope-reorder), so that a file of many
# minutes does not start last and leave one worker running alone at the end.
LONGEST_FIRST = ["test_book.py", "test_hub.py", "test_reference_switch.py",
                 "test_cluster.py"]


def _longest_first(items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.path)).name, len(rank)))


def pytest_collection_modifyitems(config, items):
    """Run the longest files first; skip notebooks needing more GPUs than torch sees,
    and `gpu(n)` tests likewise."""
    _longest_first(items)   # a stable sort: each file's own order is kept
    notebooks = {Path(str(item.path)) for item in items if item.path.suffix == ".ipynb"}
    if not notebooks and not any(gpus_needed(item) for item in items):
        return   # nothing to decide: no need to import torch
    import torch

    found = torch.cuda.device_count()  # NVML only: does not initialise CUDA here
    reasons = {}
    if notebooks:
        from coursetools.notebooks import hardware_skip_reason

        reasons = {path: hardware_skip_reason(path, found) for path in notebooks}
    for item in items:
        reason = reasons.get(Path(str(item.path)))
        need = gpus_needed(item)
        if need and found < need:
            reason = f"needs {need} CUDA GPU(s) (@pytest.mark.gpu), {found} found"
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


# GPU tests: `@pytest.mark.gpu` needs one GPU, `@pytest.mark.gpu(2)` two; each is
# skipped where torch sees fewer. The GPU lane sets LABKIT_REQUIRE_GPU=N, the GPUs its
# runner has: there a skip of a test needing at most N GPUs is a failure (the GPUs
# were not seen, or a test skipped itself), while a test needing more than N stays a
# skip (that runner cannot run it), and the skip reason says so.

REQUIRE_GPU_ENV = "LABKIT_REQUIRE_GPU"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu(n=1): needs n CUDA GPUs (skipped with fewer)")
    # The Chinese notebooks' cells fail on English prose in what they show
    # (tests/chinese_outputs.py): registered as a plugin, so that it sees the cells
    # of solutions/zh_CN, which this folder's conftest hooks would not.
    from chinese_outputs import EnglishInOutputs

    config.pluginmanager.register(EnglishInOutputs(), "labkit-english-in-outputs")


def gpus_needed(item) -> int:
    """Return how many GPUs a test's `gpu` marker asks for (0: not a GPU test)."""
    marker = item.get_closest_marker("gpu")
    if marker is None:
        return 0
    return int(marker.args[0]) if marker.args else int(marker.kwargs.get("n", 1))


def lane_gpus() -> int:
    """Return the GPUs the lane declares (LABKIT_REQUIRE_GPU=N; unset: 0)."""
    value = os.environ.get(REQUIRE_GPU_ENV, "").strip()
    return int(value) if value.isdigit() else 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Turn the skip of a `gpu` test the lane can run into a failure."""
    outcome = yield
    report = outcome.get_result()
    need, declared = gpus_needed(item), lane_gpus()
    if report.skipped and need and need <= declared:
        import torch

        why = report.longrepr[-1] if isinstance(report.longrepr, tuple) else ""
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} was skipped, but {REQUIRE_GPU_ENV}={declared}: this lane "
            f"declares {declared} GPU(s) and the test needs {need}, so it must run "
            f"(torch sees {torch.cuda.device_count()}: are the GPUs visible?). "
            f"Skip reason: {why}")


# The cluster in a box (labkit.cluster): tests that build network-namespace nodes take
# this fixture, in the runtime's tests and in labs 03, 06 and 09's rooms.
REQUIRE_CLUSTER_ENV = "LABKIT_REQUIRE_CLUSTER"


@pytest.fixture
def can_cluster():
    """Skip (or, with LABKIT_REQUIRE_CLUSTER=1, fail) where no cluster can run."""
    from labkit import cluster

    reason = cluster.unavailable()
    if reason:
        required = os.environ.get(REQUIRE_CLUSTER_ENV) == "1"
        (pytest.fail if required else pytest.skip)(f"cluster in a box {reason}")
