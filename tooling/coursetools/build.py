"""Build the learner notebooks in labs/ from the solved ones in solutions/.

Taught in: nowhere (course tooling: ``labkit build-labs``). One source of truth,
nbgrader's convention (``coursetools.notebooks``): the solved regions become stubs,
outputs are cleared. ``build_labs(check=True)`` reports stale files without writing.

The same build keeps four things derived from the solutions in step with them:

- nbgrader's cell metadata in solutions/ (an exercise cell is a ``solution`` cell, the
  check cell right after it an autograder test worth one point), so that real
  ``nbgrader generate_assignment`` makes the same labs and ``nbgrader autograde``
  scores them;
- each lab's reference solutions (``labkit/labs/<room>/reference.json``, the room
  the notebook imports its checks from), what ``checks.use_reference(...)`` puts in
  place of a stuck learner's code;
- each lab header's ``**Time:**`` sentence and INSTRUCTORS.md's table of lab times
  (``coursetools.times``), its tracks, their schedules and GPU needs, refused when a
  track leaves out a prerequisite or overruns its day (``coursetools.tracks``);
- the drawing of the course's layers in book/architecture.md (``coursetools.layers``).
"""

import json
import re
from pathlib import Path

import nbformat

from coursetools import guides, i18n, layers, times, tracks
from coursetools.notebooks import (CourseError, exercises, make_lab, refresh, render,
                                   replace_block)

__all__ = ["build_labs", "nbgrader_metadata", "references", "room_of", "ROOMS"]

# The rooms: one package per lab under labkit/labs/ (its reference.json goes there).
ROOMS = Path(__file__).resolve().parents[2] / "labkit" / "labs"
_CHECKS_IMPORT = re.compile(r"from labkit\.labs\.(\w+) import [^\n]*\bchecks\b")


def _grade_id(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", key)


def nbgrader_metadata(solution: nbformat.NotebookNode, name: str = "") -> bool:
    """Give exercise and check cells nbgrader's metadata; return whether any changed.

    An exercise cell is a ``solution`` cell; its check is a locked autograder test
    worth one point (it passes when the check cell runs without an error). Every
    other cell carries no nbgrader metadata.
    """
    wanted = {}
    for ex in exercises(solution, name):
        gid = _grade_id(ex["key"])
        wanted[ex["cell"]] = {"grade": False, "grade_id": gid, "locked": False,
                              "schema_version": 3, "solution": True, "task": False}
        wanted[ex["check_cell"]] = {"grade": True, "grade_id": f"check_{gid}",
                                    "locked": True, "points": 1, "schema_version": 3,
                                    "solution": False, "task": False}
    changed = False
    for index, cell in enumerate(solution.cells):
        want = wanted.get(index)
        if cell.metadata.get("nbgrader") != want:
            changed = True
            if want is None:
                cell.metadata.pop("nbgrader")
            else:
                cell.metadata["nbgrader"] = want
    return changed


def room_of(solution: nbformat.NotebookNode) -> str | None:
    """Return the room a lab imports its checks from (``from labkit.labs.X import
    checks`` in its first code cell), or None."""
    setup = next((c.source for c in solution.cells if c.cell_type == "code"), "")
    found = _CHECKS_IMPORT.search(setup)
    return found.group(1) if found else None


def references(solution: nbformat.NotebookNode, name: str) -> str:
    """Return the reference store of one lab (JSON text): its exercises' solved code."""
    store = {"notebook": name, "room": room_of(solution),
             "exercises": [{k: ex[k] for k in ("key", "kind", "file", "title",
                                               "check", "source")}
                           for ex in exercises(solution, name)]}
    return json.dumps(store, indent=1, ensure_ascii=False) + "\n"


def build_labs(
    solutions_dir="solutions", labs_dir="labs", check: bool = False, rooms_dir=None,
) -> list[Path]:
    """Write labs/ from solutions/; return the files that changed (or would, with check).

    Also refreshes the solutions' nbgrader metadata and, when ``rooms_dir`` is given
    (the CLI gives labkit's own, ``ROOMS``), each lab's reference store in its room.
    A lab with no solution behind it counts as stale (and is deleted when not
    checking).
    """
    solutions_dir, labs_dir = Path(solutions_dir), Path(labs_dir)
    sources = sorted(solutions_dir.glob("*.ipynb"))
    if not sources:
        raise CourseError(f"No notebooks in {solutions_dir}: nothing to build.")
    changed, english = [], {}
    for source in sources:
        solution = nbformat.read(source, as_version=4)
        nbgrader_metadata(solution, source.name)
        times.apply_header(solution)
        english[source.name] = solution
        refresh(source, render(solution), check, changed)
        refresh(labs_dir / source.name, render(make_lab(solution, source.name)),
                check, changed)
        room = room_of(solution)
        if rooms_dir is not None and room is not None:
            refresh(Path(rooms_dir) / room / "reference.json",
                    references(solution, source.name), check, changed)
    instructors, guide = solutions_dir.parent / "INSTRUCTORS.md", None
    if instructors.exists():
        notebooks = {s.name: nbformat.read(s, as_version=4) for s in sources}
        for notebook in notebooks.values():
            times.apply_header(notebook)   # as written above (unless checking)
        text = times.instructors_text(instructors.read_text(), notebooks)
        guide = tracks.instructors_text(text, notebooks)
        refresh(instructors, guide, check, changed)
    architecture = solutions_dir.parent / "book" / "architecture.md"
    if architecture.exists():
        refresh(architecture, replace_block(architecture.read_text(), "layers",
                                            "```text\n" + layers.drawing() + "```\n",
                                            "book/architecture.md"), check, changed)
    names = {s.name for s in sources}
    for orphan in sorted(labs_dir.glob("*.ipynb")):
        if orphan.name not in names:
            changed.append(orphan)
            if not check:
                orphan.unlink()
    # Translated editions (coursetools.i18n): solutions/<lang>/ and labs/<lang>/ from the
    # catalogs in locale/, then INSTRUCTORS.<lang>.md (coursetools.guides); with check,
    # their untranslated entries count as stale too.
    changed += i18n.build_translations(english, solutions_dir, labs_dir, check)
    if guide is not None:
        changed += guides.build_guides(solutions_dir.parent, guide, notebooks, check)
    return changed


