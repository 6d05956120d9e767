"""Tests for coursetools.build and .notebooks (labs/ from solutions/) and the
repository's notebooks."""

import json
from pathlib import Path

import nbformat
import pytest

from coursetools import build, notebooks

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = "def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n"


def _notebook(*sources: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


def test_stub_keeps_indent_and_raises():
    """Does a solution region become an indented NotImplementedError stub?"""
    lab = notebooks.make_lab(_notebook(SOLUTION))
    assert (
        lab.cells[0].source
        == "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    )
    namespace: dict = {}
    exec(lab.cells[0].source, namespace)
    with pytest.raises(NotImplementedError):
        namespace["f"](1)


def test_markdown_answer_is_blanked():
    """Does a markdown solution become YOUR ANSWER HERE?"""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("Q?\n### BEGIN SOLUTION\nA.\n### END SOLUTION")
    ]
    assert notebooks.make_lab(nb).cells[0].source == "Q?\nYOUR ANSWER HERE"


def test_outputs_are_cleared():
    """Are outputs and execution counts removed from the lab?"""
    nb = _notebook("print(1)")
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="1\n")]
    nb.cells[0].execution_count = 3
    cell = notebooks.make_lab(nb).cells[0]
    assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.parametrize(
    "source, message",
    [
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "nested"),
        ("x = 1\n### END SOLUTION", "without"),
        ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ],
)
def test_bad_markers_name_notebook_and_cell(source, message):
    """Do malformed markers fail with the notebook name and cell index?"""
    with pytest.raises(notebooks.CourseError, match=rf"demo.ipynb cell 1: .*{message}"):
        notebooks.make_lab(_notebook("x = 0", source), "demo.ipynb")


def test_build_and_check(tmp_path):
    """Does --check see stale and orphan labs, and does a build make them fresh?"""
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    solutions.mkdir()
    nb = _notebook(SOLUTION, "checks.f(f)")
    build.nbgrader_metadata(nb)
    nbformat.write(nb, solutions / "a.ipynb")
    assert build.build_labs(solutions, labs, check=True) == [labs / "a.ipynb"]
    assert not labs.exists()
    assert build.build_labs(solutions, labs) == [labs / "a.ipynb"]
    assert build.build_labs(solutions, labs, check=True) == []
    nbformat.write(_notebook("x"), labs / "orphan.ipynb")
    assert build.build_labs(solutions, labs, check=True) == [labs / "orphan.ipynb"]
    build.build_labs(solutions, labs)
    assert not (labs / "orphan.ipynb").exists()


def test_build_marks_cells_for_nbgrader_and_stores_references(tmp_path):
    """Does a build give nbgrader's metadata to exercise and check cells, and write
    the reference store that use_reference reads into the lab's room?"""
    solutions, labs, rooms = tmp_path / "solutions", tmp_path / "labs", tmp_path / "r"
    solutions.mkdir()
    nb = _notebook("from labkit.labs.ddp import checks", SOLUTION, "checks.f(f)",
                   "print(f(2))")
    nbformat.write(nb, solutions / "a.ipynb")
    store_path = rooms / "ddp" / "reference.json"
    changed = build.build_labs(solutions, labs, rooms_dir=rooms)
    assert set(changed) == {solutions / "a.ipynb", labs / "a.ipynb", store_path}
    cells = nbformat.read(solutions / "a.ipynb", as_version=4).cells
    assert "nbgrader" not in cells[0].metadata and "nbgrader" not in cells[3].metadata
    assert cells[1].metadata.nbgrader["solution"] is True
    assert cells[1].metadata.nbgrader["grade"] is False
    assert cells[2].metadata.nbgrader["grade"] is True
    assert cells[2].metadata.nbgrader["points"] == 1
    assert nbformat.read(labs / "a.ipynb", as_version=4).cells[2].metadata.nbgrader[
        "locked"] is True
    store = json.loads(store_path.read_text())
    assert store["room"] == "ddp" and store["notebook"] == "a.ipynb"
    assert store["exercises"] == [{"key": "f", "kind": "cell", "file": None,
                                   "title": "", "check": "f",
                                   "source": "def f(x):\n    return 2 * x"}]
    assert build.build_labs(solutions, labs, check=True, rooms_dir=rooms) == []
    store_path.write_text("{}")
    assert build.build_labs(solutions, labs, check=True,
                            rooms_dir=rooms) == [store_path]


def test_the_room_is_read_from_the_checks_import():
    """Is the room found whatever else the setup cell imports from it?"""
    for line in ("from labkit.labs.pipeline import checks",
                 "from labkit.labs.pipeline import checks, explorer",
                 "from labkit.labs.pipeline import explorer, checks"):
        assert build.room_of(_notebook(line)) == "pipeline"
    assert build.room_of(_notebook("from labkit.labs.pipeline import explorer")) is None


def test_an_exercise_without_its_check_is_an_error():
    """Does an exercise cell with no check cell after it fail, naming the cell?"""
    with pytest.raises(notebooks.CourseError, match="a.ipynb cell 0: the next code cell"):
        notebooks.exercises(_notebook(SOLUTION, "print(1)"), "a.ipynb")


def test_empty_solutions_is_an_error(tmp_path):
    """Does an empty solutions folder fail clearly instead of deleting every lab?"""
    with pytest.raises(notebooks.CourseError, match="No notebooks"):
        build.build_labs(tmp_path, tmp_path / "labs")


def test_repository_labs_are_up_to_date():
    """Are the committed labs, nbgrader metadata and references what build-labs makes?"""
    stale = build.build_labs(ROOT / "solutions", ROOT / "labs", check=True,
                             rooms_dir=build.ROOMS)
    assert stale == [], f"stale labs {stale}: run `labkit build-labs`"


@pytest.mark.parametrize(
    "path", sorted(ROOT.glob("labs/*.ipynb")), ids=lambda p: p.name
)
def test_labs_hold_no_solution_code(path):
    """Does no lab keep a solution marker?"""
    text = path.read_text()
    assert notebooks.BEGIN not in text and notebooks.END not in text


@pytest.mark.parametrize(
    "path",
    sorted([*ROOT.glob("labs/*.ipynb"), *ROOT.glob("solutions/*.ipynb")]),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_notebooks_are_committed_without_outputs(path):
    """Is every notebook stored without outputs or execution counts?"""
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"cell {index}"


@pytest.mark.parametrize(
    "path", sorted(ROOT.glob("solutions/*.ipynb")), ids=lambda p: p.name
)
def test_notebook_declares_its_hardware(path):
    """Does every solution say what hardware it needs (metadata.labkit)?"""
    needs = nbformat.read(path, as_version=4).metadata.get("labkit", {})
    assert {"min_gpus", "cpu_ok"} <= set(needs), (
        "metadata.labkit needs min_gpus and cpu_ok"
    )


@pytest.mark.parametrize("path", sorted(ROOT.glob("solutions/*.ipynb")), ids=lambda p: p.name)
def test_every_lab_states_its_measured_time(path):
    """Does every lab header carry the computed Time sentence, from a measurement?"""
    from coursetools import times as lab_time

    nb = nbformat.read(path, as_version=4)
    assert lab_time.apply_header(nb), f"{path.name}: no '**Time:** ... **Hardware:**'"
    assert nb.metadata.get("labkit", {}).get("measured"), (
        f"{path.name}: its compute time was never measured: run `labkit measure-labs`")




@pytest.mark.parametrize("path", sorted(ROOT.glob("solutions/*.ipynb")), ids=lambda p: p.name)
def test_predict_cells_leave_the_guess_to_the_learner(path):
    """Is every Predict guess (`my_guess... = ...`) left blank in the solution, so that
    the learner's lab (and nbgrader's release) hands out no answer?"""
    import re

    guess = re.compile(r"^\s*(my_guess\w*)\s*=\s*([^#\n]*?)\s*(#.*)?$", re.MULTILINE)
    filled = [(m.group(1), m.group(2)) for cell in nbformat.read(path, 4).cells
              if cell.cell_type == "code" for m in guess.finditer(cell.source)
              if m.group(2) != "..."]
    assert not filled, f"{path.name}: Predict guesses given away: {filled}"
