"""Tests for notebook hardware metadata: the nbval collector and env/gpu_check.py."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _copy_conftest(folder) -> None:
    """Put the project's conftest in ``folder``; ``_env`` finds what it imports."""
    shutil.copy(ROOT / "tests" / "conftest.py", folder / "conftest.py")


def _env(**extra) -> dict:
    """This environment, with tests/ importable (the conftest's plugin modules)."""
    path = os.pathsep.join(filter(None, [str(ROOT / "tests"),
                                         os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}
FOUND = torch.cuda.device_count()


def _notebook(path: Path, source: str, **labkit) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["labkit"] = labkit
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, path)
    return path


def _gpu_check():
    path = ROOT / "env" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def notebooks(tmp_path, monkeypatch) -> Path:
    """A folder with the project's conftest and three tiny notebooks (gpu_check's
    pytest runs inherit the PYTHONPATH that finds the conftest's plugin modules)."""
    _copy_conftest(tmp_path)
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    boom = "raise RuntimeError('this cell must have been skipped')"
    _notebook(tmp_path / "needs_more.ipynb", boom, min_gpus=FOUND + 1, cpu_ok=True,
              world_size=FOUND + 1)
    _notebook(tmp_path / "fits.ipynb", "print('ran')", min_gpus=0, cpu_ok=True,
              world_size=1)
    _notebook(tmp_path / "gpu_only.ipynb", "print('ran on a GPU')" if FOUND else boom,
              min_gpus=0, cpu_ok=False, world_size=1)
    return tmp_path


def test_collector_skips_notebooks_needing_more_gpus(notebooks):
    """Are a notebook's cells skipped, with the numbers, when it needs more GPUs?"""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", "--nbval-lax",
         "--nbval-current-env", "needs_more.ipynb", "fits.ipynb", "gpu_only.ipynb"],
        cwd=notebooks, capture_output=True, text=True, timeout=300, env=_env())
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert (f"needs_more.ipynb needs {FOUND + 1} GPU(s) (metadata.labkit.min_gpus), "
            f"this machine has {FOUND}") in out
    assert ("1 passed" if FOUND == 0 else "2 passed") in out
    if FOUND == 0:
        assert "gpu_only.ipynb is GPU-only (metadata.labkit.cpu_ok is false)" in out


@pytest.mark.parametrize("path", sorted(ROOT.glob("solutions/*.ipynb")),
                         ids=lambda p: p.name)
def test_solution_hardware_metadata_is_well_formed(path):
    """Does every solution declare sane min_gpus, cpu_ok and world_size?"""
    needs = nbformat.read(path, as_version=4).metadata.get("labkit", {})
    assert set(needs) >= {"min_gpus", "cpu_ok", "world_size"}, needs
    assert isinstance(needs["min_gpus"], int) and needs["min_gpus"] >= 0
    assert isinstance(needs["cpu_ok"], bool)
    assert isinstance(needs["world_size"], int) and needs["world_size"] >= 1
    assert needs["cpu_ok"] or needs["min_gpus"] >= 1, "GPU-only needs min_gpus >= 1"


def test_gpu_check_prints_table_and_skips_with_reason(notebooks, capsys):
    """Does gpu_check run what fits, skip what needs GPUs, print one row each?"""
    gpu_check = _gpu_check()
    paths = [notebooks / "fits.ipynb", notebooks / "needs_more.ipynb"]
    assert gpu_check.main([str(p) for p in paths]) == 0
    out = capsys.readouterr().out
    header, rule, fits, needs_more = out.strip().splitlines()[-4:]
    assert header.split()[:4] == ["notebook", "result", "seconds", "backend"]
    assert set(rule) == {"-"}
    assert fits.split()[:2] == ["fits.ipynb", "PASS"]
    assert ("gloo/cpu x1" if FOUND == 0 else "nccl/cuda x1") in fits
    assert needs_more.split()[:3] == ["needs_more.ipynb", "SKIP", "0.0"]
    assert f"needs {FOUND + 1} GPU(s) (metadata.labkit.min_gpus)" in needs_more


def test_gpu_check_reports_failures(tmp_path, capsys):
    """Does a failing notebook make a FAIL row and exit status 1?"""
    path = _notebook(tmp_path / "broken.ipynb", "1 / 0", min_gpus=0, cpu_ok=True,
                     world_size=1)
    assert _gpu_check().main([str(path)]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].split()[:2] == [
        "broken.ipynb", "FAIL"]


_GPU_TEST = """
import pytest

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="needs a CUDA GPU")
def test_on_a_gpu():
    pass
"""


@pytest.mark.parametrize("require, outcome", [
    ("0", "1 skipped"), ("1", "was skipped, but LABKIT_REQUIRE_GPU=1")])
def test_gpu_lane_fails_on_a_skipped_gpu_test(tmp_path, require, outcome):
    """With LABKIT_REQUIRE_GPU=1 (the GPU lane), is a skipped `gpu` test a failure?"""
    _copy_conftest(tmp_path)
    (tmp_path / "test_gpu.py").write_text(_GPU_TEST)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-m", "gpu", "test_gpu.py"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120,
                          env=_env(LABKIT_REQUIRE_GPU=require))
    assert outcome in done.stdout, done.stdout
    assert (done.returncode != 0) == (require == "1")   # the lane goes red


_TWO_GPU_TEST = """
import pytest

@pytest.mark.gpu(99)
def test_on_many_gpus():
    pass
"""


def test_gpu_lane_skips_what_its_runner_lacks(tmp_path):
    """On a lane declaring 1 GPU, does a test needing more stay a skip, saying why?"""
    _copy_conftest(tmp_path)
    (tmp_path / "test_gpus.py").write_text(_TWO_GPU_TEST)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-rs", "-m", "gpu", "test_gpus.py"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120,
                          env=_env(LABKIT_REQUIRE_GPU="1"))
    assert done.returncode == 0, done.stdout
    assert f"needs 99 CUDA GPU(s) (@pytest.mark.gpu), {FOUND} found" in done.stdout


def test_every_gpu_only_test_is_marked_gpu():
    """Does every test skipped for want of a GPU carry the `gpu` marker?"""
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("@pytest.mark.skipif") and "cuda" in line:
                marks = [m for m in lines[i - 3:i] if re.fullmatch(
                    r"@pytest\.mark\.gpu(\(\d+\))?", m)]
                assert marks, f"{path.name}:{i + 1}: mark it @pytest.mark.gpu(n)"
