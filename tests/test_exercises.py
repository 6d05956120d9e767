"""Does every exercise's check fail on the lab's stub and pass on the solution?

Convention (see README, "Writing a lab"): an exercise is a code cell holding
``### BEGIN SOLUTION``; the next code cell is its check (``checks.<name>(...)``).
Both run right after the notebook's first code cell (its setup), in-process.
"""

import contextlib
import io
from pathlib import Path

import nbformat
import pytest

from labkit import checks, course

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))


def _run(source: str, namespace: dict) -> str:
    """Execute a cell (skipping IPython magics and shell lines); return its stdout."""
    lines = [
        line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        exec(compile("\n".join(lines), "<cell>", "exec"), namespace)
    return out.getvalue()


def _exercises(path: Path):
    """Return the setup cell's source and (exercise, check) source pairs."""
    code = [
        c.source
        for c in nbformat.read(path, as_version=4).cells
        if c.cell_type == "code"
    ]
    solved = nbformat.read(ROOT / "solutions" / path.name, as_version=4)
    marked = [
        i
        for i, c in enumerate(c for c in solved.cells if c.cell_type == "code")
        if course.BEGIN in c.source
    ]
    pairs = [(code[i], code[i + 1]) for i in marked]
    for _, check in pairs:
        assert "checks." in check, (
            f"{path.name}: the cell after an exercise must call a check"
        )
    return code[0], pairs


@pytest.mark.parametrize("name", NAMES)
def test_checks_pass_on_solution(name):
    """Does each check pass on the solved exercise, with three or more per lab?"""
    setup, pairs = _exercises(ROOT / "solutions" / name)
    assert len(pairs) >= 3, f"{name} has {len(pairs)} checked exercises, want >= 3"
    namespace: dict = {}
    _run(setup, namespace)
    for exercise, check in pairs:
        _run(exercise, namespace)
        assert "✅" in _run(check, namespace), f"no pass line from {check!r}"


@pytest.mark.parametrize("name", NAMES)
def test_checks_fail_on_stub(name):
    """Does each check raise ExerciseFailed on the generated stub?"""
    setup, pairs = _exercises(ROOT / "labs" / name)
    base: dict = {}
    _run(setup, base)
    for exercise, check in pairs:
        namespace = dict(base)
        assert "NotImplementedError" in exercise
        _run(exercise, namespace)  # stubs are function bodies: defining them must work
        with pytest.raises(checks.ExerciseFailed):
            _run(check, namespace)
