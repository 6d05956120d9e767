"""Can a stuck learner go on? Every lab runs to its end on labkit's references.

Each learner notebook (labs/, stubs and all) runs top to bottom in a real kernel, as a
learner who is stuck at every exercise would run it: at each check cell the check must
fail with "not done yet" ending in the one line that takes the reference
(`checks.use_reference("...")`); the test runs exactly that line, the check again
(it must pass), and goes on. Every later cell must then run without an error: the rest
of the lab works on the reference.
"""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from coursetools import notebooks

ROOT = Path(__file__).resolve().parents[2]
NAMES = sorted(p.name for p in (ROOT / "labs").glob("*.ipynb"))

TAKE_THE_LINE = '''from labkit.checks import ExerciseFailed as _ExerciseFailed
import re as _re
_check = {source!r}
try:
    exec(_check)
except _ExerciseFailed as _failed:
    _message = str(_failed)
    assert "not done yet" in _message, "the stub's failure is not 'not done yet': " + _message
    _line = _re.search(r"`(checks\\.use_reference\\([^`]*\\))`$", _message.strip())
    assert _line, "'not done yet' does not end with the use_reference line: " + _message
    print("taking:", _line.group(1))
    exec(_line.group(1))
    exec(_check)
else:
    raise AssertionError("the check passed on the lab's stub")
'''


def _plain(text: str) -> str:
    """Drop the terminal colours of IPython's tracebacks."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _stuck_learner(name: str) -> tuple[nbformat.NotebookNode, list[int]]:
    """The learner notebook with each check cell wrapped to take the reference line."""
    solution = nbformat.read(ROOT / "solutions" / name, as_version=4)
    checks = [ex["check_cell"] for ex in notebooks.exercises(solution, name)]
    lab = nbformat.read(ROOT / "labs" / name, as_version=4)
    for index in checks:
        lab.cells[index].source = TAKE_THE_LINE.format(source=lab.cells[index].source)
    lab.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                  "language": "python"}
    return lab, checks


@pytest.mark.parametrize("name", NAMES)
def test_every_lab_runs_to_its_end_on_the_references(name, tmp_path):
    """Does the lab run to its end when every exercise is taken via use_reference?"""
    lab, checks = _stuck_learner(name)
    assert checks, f"{name} has no exercise"
    client = NotebookClient(lab, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellExecutionError as err:
        ran = [i for i, c in enumerate(lab.cells)
               if c.cell_type == "code" and c.get("execution_count")]
        pytest.fail(f"{name}: cell {ran[-1] if ran else '?'} failed after the "
                    f"references were taken:\n{_plain(str(err))[-3000:]}")
    for index in checks:
        text = "".join(o.get("text", "") for o in lab.cells[index].outputs)
        assert "REFERENCE" in text and "✅" in text, (
            f"{name} cell {index}: the reference was not taken or its check did not "
            f"pass:\n{text[-1500:]}")
