"""The Slurm example: linted, calls files that exist, runs on one node here."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "env" / "slurm" / "ddp.sbatch"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    """Return a command's path (venv first, then PATH), or fail saying how to get it."""
    found = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.fail(f"{name} not found: pip install -r env/requirements.txt")
    return found


def _run_sbatch(*args: str, env: dict | None = None, timeout: float = 180):
    full = {**os.environ, "TORCHRUN": _tool("torchrun"), "LABKIT_OFFLINE": "1",
            **(env or {})}
    return subprocess.run(["bash", str(SBATCH), *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=timeout)


def test_sbatch_script_parses():
    """Does bash accept the script's syntax (bash -n)?"""
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)


def test_sbatch_script_passes_shellcheck():
    """Does shellcheck find nothing to warn about?"""
    done = subprocess.run([_tool("shellcheck"), str(SBATCH)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout


def test_sbatch_script_calls_files_that_exist():
    """Does every course file the script names exist (tutorials often miss this)?"""
    named = set(re.findall(r"env/slurm/[\w./-]+\.py", SBATCH.read_text()))
    assert named, "the script should name its training script"
    assert all((ROOT / path).is_file() for path in named), named


def test_single_node_run_trains_and_ranks_agree():
    """Does the script, outside Slurm, train 2 CPU ranks with identical parameters?"""
    done = _run_sbatch("--steps", "3", "--limit", "512", "--global-batch", "64",
                       env={"NPROC_PER_NODE": "2"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 node x 2 rank(s)" in done.stdout
    assert "parameters identical on every rank: True" in done.stdout


def test_slurm_branch_starts_one_torchrun_per_node(tmp_path):
    """Under Slurm, does srun start torchrun on 2 nodes with the head node's address?"""
    fakes = {"scontrol": 'printf "node01\\nnode02\\n"', "srun": 'echo "srun $*"'}
    for name, body in fakes.items():
        (tmp_path / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (tmp_path / name).chmod(0o755)
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
           "SLURM_JOB_ID": "12345", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_SUBMIT_DIR": str(ROOT),
           "NPROC_PER_NODE": "4"}
    done = _run_sbatch("--steps", "5", env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    srun = next(line for line in done.stdout.splitlines() if line.startswith("srun"))
    for part in ("--ntasks-per-node=1", "--nnodes=2", "--nproc-per-node=4",
                 "--rdzv-endpoint=node01:22345", "--rdzv-id=12345",
                 "env/slurm/train_ddp.py --steps 5"):
        assert part in srun, srun


def test_missing_torchrun_is_a_clear_error():
    """Does the script say to activate the venv when torchrun is missing?"""
    done = _run_sbatch(env={"TORCHRUN": "no-such-torchrun"}, timeout=30)
    assert done.returncode == 1
    assert "activate the course venv" in done.stderr


def _fake_tools(folder: Path, gpus: int) -> dict:
    """nvidia-smi listing ``gpus`` GPUs (all of the node's: it ignores
    CUDA_VISIBLE_DEVICES) and a torchrun that only prints its arguments."""
    smi = "".join(f"GPU {i}: NVIDIA H100 (UUID: GPU-{i})\\n" for i in range(gpus))
    fakes = {"nvidia-smi": f'printf "{smi}"', "torchrun-fake": 'echo "torchrun $*"'}
    for name, body in fakes.items():
        (folder / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (folder / name).chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}",
            "TORCHRUN": str(folder / "torchrun-fake")}


@pytest.mark.parametrize("env, ranks", [
    ({}, 8),                                              # nothing narrower: the node
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, 2),                 # no cgroups: 2 of the 8
    ({"CUDA_VISIBLE_DEVICES": ""}, 2),                    # none visible: 2 CPU ranks
    ({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4),
])
def test_ranks_per_node_follow_the_gpus_the_job_sees(tmp_path, env, ranks):
    """On a node whose nvidia-smi lists 8 GPUs, does the script start one rank per
    GPU the job may use (Slurm's count, else CUDA_VISIBLE_DEVICES), not 8?"""
    base = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "SLURM_JOB_ID",
                         "NPROC_PER_NODE")}
    full = {**base, **_fake_tools(tmp_path, 8), **env}
    done = subprocess.run(["bash", str(SBATCH)], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert f"No Slurm job: 1 node x {ranks} rank(s)" in done.stdout
    assert f"--nproc-per-node={ranks}" in done.stdout
