"""The two commands of the README (`make lab`, `make test`) and CI's `.ci/run`.

A newcomer on a fresh machine types one of two commands and nothing else: these
tests read what each command would run (`make -n`) and check the order that makes
that true.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(target: str) -> list[str]:
    """Return the shell lines `make TARGET` would run, as if the venv were ready."""
    done = subprocess.run(["make", "-n", "-W", "env/requirements.txt", target,
                           "STAMP=/dev/null"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.replace("\\\n", " ").splitlines() if line]


def test_make_test_prepares_data_online_then_tests_offline():
    """Does `make test` fetch MNIST when missing (no step by hand), tests offline?"""
    lines = _dry_run("test")
    prepare = next(i for i, line in enumerate(lines) if "data prepare" in line)
    pytest_line = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert prepare < pytest_line
    assert "OFFLINE" not in lines[prepare] and "--offline" not in lines[prepare]
    assert "LABKIT_OFFLINE=1" in lines[pytest_line]
    assert "LABKIT_QUICK=1" in lines[pytest_line]


def test_readme_names_the_two_commands():
    """Does the README's "Two commands" give exactly `make lab` and `make test`?"""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Two commands.*?```bash\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert [c for c in commands if c] == ["make lab", "make test"]


def test_ci_runs_exactly_the_readme_test_command():
    """Does .ci/run end in `make test`, with only data and Chromium set up before?"""
    script = (ROOT / ".ci" / "run").read_text()
    code = [line.strip() for line in script.splitlines()
            if line.strip() and not line.strip().startswith("#")]
    assert code[-1] == "make test"


def test_build_labs_check_needs_no_torch():
    """Does `labkit build-labs --check` run without importing torch (fast, light)?"""
    code = ("import sys; sys.modules['torch'] = None; from labkit import cli; "
            "raise SystemExit(cli.main(['build-labs', '--check']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# Installing from inside China (book/zh_CN/setup.md): a PyPI mirror, CPU-only wheels
# and MNIST from a folder or a mirror reach the commands `make lab` runs.

def _fake_venv(tmp_path: Path) -> Path:
    """A venv whose python, labkit and jupyter only log their environment and args."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "labkit", "jupyter"):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $PIP_INDEX_URL '
                          f'$LABKIT_MNIST_MIRROR $*" >> "{tmp_path}/log"\n')
        script.chmod(0o755)
    return tmp_path / "venv"


def _make(tmp_path: Path, *arguments: str) -> list[str]:
    venv = _fake_venv(tmp_path)
    done = subprocess.run(["make", f"VENV={venv}", *arguments], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return (tmp_path / "log").read_text().splitlines()


def test_make_lab_takes_a_pypi_mirror_and_the_cpu_wheels(tmp_path):
    """Do PIP_INDEX_URL and TORCH_INDEX reach every pip install of `make lab`?"""
    mirror = "https://pypi.tuna.tsinghua.edu.cn/simple"
    cpu = "https://download.pytorch.org/whl/cpu"
    log = _make(tmp_path, "lab", f"PIP_INDEX_URL={mirror}", f"TORCH_INDEX={cpu}",
                "LABKIT_MNIST_MIRROR=/srv/mnist")
    pips = [line for line in log if line.startswith("python ")]
    assert len(pips) == 3 and all(f"python {mirror} " in line for line in pips)
    assert pips[0].endswith(f"--index-url {cpu} torch==2.14.1 torchvision==0.29.1")
    assert "-r env/requirements.txt" in pips[1]       # the rest, after torch
    prepare = next(line for line in log if line.startswith("labkit "))
    assert prepare == f"labkit {mirror} /srv/mnist data prepare"


def test_make_lab_without_settings_installs_from_pypi(tmp_path):
    """Without TORCH_INDEX, is there one install of the pins and no index of its own?"""
    log = _make(tmp_path, "lab", "PIP_INDEX_URL=", "LABKIT_MNIST_MIRROR=")
    pips = [line for line in log if line.startswith("python ")]
    assert len(pips) == 2 and not any("--index-url" in line for line in pips)
