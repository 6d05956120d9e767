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
