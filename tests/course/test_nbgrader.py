"""Real nbgrader on the course: the classroom grading tool reads it as it is.

``labkit build-labs`` gives exercise cells nbgrader's ``solution`` metadata and check
cells its autograder-test metadata (one point each). Here nbgrader itself, in a
temporary course folder, (1) generates the student version of every solution
notebook, which must equal labs/ cell for cell, and (2) autogrades lab 00 as a graded
course does (``LABKIT_GRADED=1``, set in the grader's nbgrader_config.py): the solved
notebook scores full marks, the released one zero, and one whose exercise cells only
take labkit's references (``checks.use_reference(...)``) zero too.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from coursetools import notebooks

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONFIG = '''c = get_config()
c.CourseDirectory.root = "."
c.CourseDirectory.course_id = "multigpu"
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
c.Execute.kernel_name = "python3"
c.Execute.timeout = 300
'''
# What the guide tells a graded course's grader to add: checks passed on a reference
# fail, so they earn no points (the grader's kernels inherit the environment).
GRADER = 'import os\nos.environ["LABKIT_GRADED"] = "1"\n'

pytest.importorskip("nbgrader", reason="nbgrader is a test dependency (pip install .[test])")


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")  # alembic
    done = subprocess.run([str(BIN / "nbgrader"), *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stderr[-3000:]}"
    return done


def _course(tmp_path: Path, assignment: str, solutions, config=CONFIG) -> Path:
    course = tmp_path / "course"
    (course / "source" / assignment).mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(config)
    for notebook in solutions:
        shutil.copy(notebook, course / "source" / assignment / notebook.name)
    return course


def _only_references(solution: Path, target: Path) -> list[str]:
    """Write the solution with each exercise cell replaced by the one line that takes
    labkit's reference; return the check cells' nbgrader ids."""
    nb = nbformat.read(solution, as_version=4)
    found = notebooks.exercises(nb, solution.name)
    for ex in found:
        nb.cells[ex["cell"]].source = f'checks.use_reference("{ex["key"]}")'
    nbformat.write(nb, target)
    return [nb.cells[ex["check_cell"]].metadata.nbgrader["grade_id"] for ex in found]


def test_generate_assignment_equals_labs(tmp_path):
    """Does real `nbgrader generate_assignment` make exactly labs/ from solutions/?"""
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    course = _course(tmp_path, "course", solutions)
    _nbgrader(course, "generate_assignment", "course", "--force")
    for solution in solutions:
        released = nbformat.read(course / "release" / "course" / solution.name, 4)
        lab = nbformat.read(ROOT / "labs" / solution.name, 4)
        assert [(c.cell_type, c.source) for c in released.cells] == [
            (c.cell_type, c.source) for c in lab.cells], (
            f"{solution.name}: nbgrader's release differs from labs/ "
            "(run `labkit build-labs`)")
        graded = [c for c in released.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert graded, f"{solution.name}: no autograded check cell"


def test_graded_autograde_gives_no_points_for_the_references(tmp_path):
    """Graded (LABKIT_GRADED=1), does `nbgrader autograde` score lab 00's solution 3/3,
    its released lab 0, and a lab that only takes the references 0 on each check?"""
    from nbgrader.api import Gradebook

    name = "00_environment_and_hardware.ipynb"
    solution = ROOT / "solutions" / name
    course = _course(tmp_path, "lab00", [solution], CONFIG + GRADER)
    _nbgrader(course, "generate_assignment", "lab00", "--force")
    folders = {student: course / "submitted" / student / "lab00"
               for student in ("solved", "released", "referenced")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    shutil.copy(solution, folders["solved"] / name)
    shutil.copy(course / "release" / "lab00" / name, folders["released"] / name)
    check_ids = _only_references(solution, folders["referenced"] / name)
    _nbgrader(course, "autograde", "lab00", "--create")
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        score = {s: gradebook.find_submission("lab00", s).score for s in folders}
        assert gradebook.find_submission("lab00", "solved").max_score == 3
        assert score == {"solved": 3, "released": 0, "referenced": 0}
        per_check = {i: gradebook.find_grade(i, name.removesuffix(".ipynb"), "lab00",
                                             "referenced").score for i in check_ids}
        assert len(per_check) == 3 and set(per_check.values()) == {0}
    graded = nbformat.read(course / "autograded" / "referenced" / "lab00" / name, 4)
    said = "".join(o.get("text", "") + str(o.get("evalue", ""))
                   for c in graded.cells if c.cell_type == "code" for o in c.outputs)
    assert "a graded course gives it no points" in said
