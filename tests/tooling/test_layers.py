"""The course's three layers hold: imports point down, rooms never import each other,
no circles; the learner-facing runtime stays apart from the tooling."""

from pathlib import Path

from coursetools import layers

ROOT = Path(__file__).resolve().parents[2]


def test_no_upward_or_sideways_imports_and_no_circles():
    """Does every import point down (tooling -> rooms -> runtime), with no room
    importing another and no module reaching itself again?"""
    assert layers.problems() == []


def test_each_room_is_a_lab_and_each_lab_has_a_room():
    """Is every room listed with its lab, and does every lab import its own room?"""
    from coursetools import build
    import nbformat

    from labkit.labs import ROOMS

    folders = {p.name for p in (ROOT / "labkit" / "labs").iterdir()
               if (p / "__init__.py").exists()}
    assert folders == set(ROOMS)
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        room = build.room_of(nbformat.read(path, as_version=4))
        assert room in ROOMS and ROOMS[room] == path.name[:2], path.name


def test_problems_name_an_upward_a_sideways_import_and_a_circle(tmp_path):
    """Would the rule catch each kind of breach, naming the modules?"""
    def write(name, text=""):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    write("labkit/__init__.py")
    write("labkit/data.py", "from labkit.labs.ddp import checks\n")          # up
    write("labkit/train.py", "import labkit.models\n")
    write("labkit/models.py", "from labkit import train\n")                  # circle
    write("labkit/labs/__init__.py")
    write("labkit/labs/ddp/__init__.py")
    write("labkit/labs/ddp/checks.py", "from labkit.labs.pipeline import checks\n")
    write("labkit/labs/pipeline/__init__.py")
    write("labkit/labs/pipeline/checks.py", "def f():\n    from coursetools import build\n")
    write("tooling/coursetools/__init__.py")
    write("tooling/coursetools/build.py", "from labkit import data\n")
    found = layers.problems(tmp_path)
    assert "upward: labkit.data (runtime) imports labkit.labs.ddp.checks (rooms)" in found
    assert ("sideways: room ddp (labkit.labs.ddp.checks) imports room pipeline "
            "(labkit.labs.pipeline.checks)") in found
    assert ("upward: labkit.labs.pipeline.checks (rooms) imports coursetools.build "
            "(tooling)") in found
    assert "circle: labkit.models -> labkit.train" in found
    assert not any("coursetools.build imports labkit.data" in p for p in found)


def test_the_drawing_in_the_book_is_the_current_one():
    """Does book/architecture.md show the layers as the imports are now?"""
    assert layers.drawing() in (ROOT / "book" / "architecture.md").read_text()
