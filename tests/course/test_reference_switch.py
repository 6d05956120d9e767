"""Can a learner always go on? Every lab runs to its end past stubs and wrong code.

Each learner notebook (labs/, stubs and all) runs top to bottom in a real kernel, and
at each check cell the test does what a learner may do:

1. on the stub, the check fails with "not done yet", ending in the one line that takes
   the reference (`checks.use_reference("...")`);
2. the test runs exactly that line, and the check passes, saying it passed on the
   reference;
3. then the learner's own solution goes in, one that runs but computes the wrong
   thing (``wrong_solutions``: a classic mistake in the solved code): the check fails,
   not as "not done yet", and ends with the reference line too;
4. the learner goes on without taking it. Every later cell must run without an error:
   each cell that builds on the exercise takes labkit's reference, saying so
   (``checks.solved``), since the exercise as it now is has not passed.

One kernel run per lab covers all four, so the course's stuck and wrong learners cost
one run of each lab.
"""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from coursetools import notebooks
from course.wrong_solutions import wrong_source

ROOT = Path(__file__).resolve().parents[2]
NAMES = sorted(p.name for p in (ROOT / "labs").glob("*.ipynb"))

STUB_REFERENCE_WRONG = '''from labkit.checks import ExerciseFailed as _ExerciseFailed
import re as _re


def _fails(check, on):
    """Run the check cell; it must fail, ending with the reference line: return it."""
    try:
        exec(check, globals())
    except _ExerciseFailed as failed:
        message = str(failed).strip()
    else:
        raise AssertionError(f"the check passed on the {{on}}")
    stub = on == "stub"
    assert ("not done yet" in message) == stub, f"on the {{on}}: {{message}}"
    line = _re.search(r"`(checks\\.use_reference\\([^`]*\\))`$", message)
    assert line, f"on the {{on}}, no reference line at the end: {{message}}"
    print(f"failed on the {{on}}:", message.splitlines()[0][:300])
    return line.group(1)


_check = {source!r}
_line = _fails(_check, "stub")                 # 1. the stub
print("taking:", _line)
exec(_line)                                    # 2. the line it ended with ...
exec(_check)                                   #    ... and the check passes
{write_wrong}
_fails(_check, "wrong solution")               # 3. wrong but running: fails too
print("going on with the wrong solution in place")   # 4.
'''
WRITE_FILE = "get_ipython().run_cell_magic('writefile', {file!r}, {source!r})"
DEFINE = "exec(compile({source!r}, '<your cell>', 'exec'), globals())"


def _plain(text: str) -> str:
    """Drop the terminal colours of IPython's tracebacks."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _learner(name: str) -> tuple[nbformat.NotebookNode, list[int]]:
    """The learner notebook with each check cell doing steps 1-4 above."""
    solution = nbformat.read(ROOT / "solutions" / name, as_version=4)
    exercises = notebooks.exercises(solution, name)
    lab = nbformat.read(ROOT / "labs" / name, as_version=4)
    for ex in exercises:
        wrong = wrong_source(ex["key"], ex["source"])
        write = (WRITE_FILE.format(file=ex["file"], source=wrong) if ex["kind"] == "file"
                 else DEFINE.format(source=wrong))
        cell = lab.cells[ex["check_cell"]]
        cell.source = STUB_REFERENCE_WRONG.format(source=cell.source, write_wrong=write)
    lab.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                  "language": "python"}
    return lab, [ex["check_cell"] for ex in exercises]


def _built_on(lab: nbformat.NotebookNode) -> set[str]:
    """The exercises that later cells ask for with checks.solved / has_passed."""
    return {key for cell in lab.cells if cell.cell_type == "code"
            for key in re.findall(r'checks\.(?:solved|has_passed)\("([^"]+)"\)',
                                  cell.source)}


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []))


# A whole lab, each check run three times: lab 07 took over 600 s on a loaded machine.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", NAMES)
def test_every_lab_runs_to_its_end_past_stubs_and_wrong_solutions(name, tmp_path):
    """At every exercise: the stub fails with its reference line, the line makes the
    check pass, a wrong-but-running solution fails with the line too; left in place,
    does the rest of the lab still run, each later cell on the reference?"""
    lab, checks = _learner(name)
    assert checks, f"{name} has no exercise"
    client = NotebookClient(lab, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellExecutionError as err:
        ran = [i for i, c in enumerate(lab.cells)
               if c.cell_type == "code" and c.get("execution_count")]
        pytest.fail(f"{name}: cell {ran[-1] if ran else '?'} failed:\n"
                    f"{_plain(str(err))[-3000:]}")
    for index in checks:
        text = _text(lab.cells[index])
        assert "REFERENCE" in text and "✅" in text, (
            f"{name} cell {index}: the reference was not taken or its check did not "
            f"pass:\n{text[-1500:]}")
        assert "failed on the wrong solution" in text, text[-1500:]
    said = "".join(_text(cell) for cell in lab.cells)
    for key in _built_on(lab):
        assert f"has not passed on your `{key}`" in said, (
            f"{name}: no later cell took the reference of {key!r} in place of the "
            "wrong solution")
