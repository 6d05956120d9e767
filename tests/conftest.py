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
    if not all((raw / f"{stem}-ubyte.gz").exists() for stem in
               ("train-images-idx3", "train-labels-idx1", "t10k-images-idx3", "t10k-labels-idx1")):
        pytest.fail(f"MNIST .gz files are not in {raw}: run `labkit data prepare` "
                    "(make test does) or copy them there.")
    return raw


@pytest.fixture
def mnist_root(tmp_path) -> Path:
    """A fresh data folder holding copies of the four original MNIST .gz files."""
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for gz in _shipped_raw().glob("*.gz"):
        shutil.copy(gz, raw / gz.name)
    return tmp_path
