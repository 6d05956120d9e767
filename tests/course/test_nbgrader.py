"""Real nbgrader on the course: the classroom grading tool reads it as it is.

``labkit build-labs`` gives exercise cells nbgrader's ``solution`` metadata and check
cells its autograder-test metadata (one point each). Here nbgrader itself, in a
temporary course folder, (1) generates the student version of every solution
notebook, which must equal labs/ cell for cell, and (2) autogrades lab 00: the solved
notebook scores full marks and the released one scores zero.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

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

pytest.importorskip("nbgrader", reason="nbgrader is a test dependency (pip install .[test])")


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")  # alembic
    done = subprocess.run([str(BIN / "nbgrader"), *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stderr[-3000:]}"
    return done


def _course(tmp_path: Path, assignment: str, notebooks) -> Path:
    course = tmp_path / "course"
    (course / "source" / assignment).mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(CONFIG)
    for notebook in notebooks:
        shutil.copy(notebook, course / "source" / assignment / notebook.name)
    return course


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


def test_autograde_gives_full_marks_to_the_solution_and_none_to_the_lab(tmp_path):
    """Does `nbgrader autograde` score lab 00's solution 3/3 and its released lab 0?"""
    from nbgrader.api import Gradebook

    name = "00_environment_and_hardware.ipynb"
    course = _course(tmp_path, "lab00", [ROOT / "solutions" / name])
    _nbgrader(course, "generate_assignment", "lab00", "--force")
    for student, source in (("solved", ROOT / "solutions" / name),
                            ("released", course / "release" / "lab00" / name)):
        folder = course / "submitted" / student / "lab00"
        folder.mkdir(parents=True)
        shutil.copy(source, folder / name)
    _nbgrader(course, "autograde", "lab00", "--create")
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        solved = gradebook.find_submission("lab00", "solved")
        released = gradebook.find_submission("lab00", "released")
        assert solved.max_score == 3
        assert (solved.score, released.score) == (3, 0)
