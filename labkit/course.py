"""Build the learner notebooks in labs/ from the solved ones in solutions/.

Taught in: nowhere (instructor tooling). One source of truth, nbgrader's convention:
code between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes a stub that raises
``NotImplementedError``; markdown between the markers becomes "YOUR ANSWER HERE".
Outputs are cleared. ``build_labs(check=True)`` reports stale labs without writing.

The same build keeps three things derived from the solutions in step with them:

- nbgrader's cell metadata in solutions/ (an exercise cell is a ``solution`` cell, the
  check cell right after it an autograder test worth one point), so that real
  ``nbgrader generate_assignment`` makes the same labs and ``nbgrader autograde``
  scores them;
- labkit's reference solutions (``labkit/references/NN_*.json``), what
  ``checks.use_reference(...)`` puts in place of a stuck learner's code;
- each lab header's ``**Time:**`` sentence and INSTRUCTORS.md's tables of lab and track
  times (``labkit.lab_time``).
"""

import json
import re
from pathlib import Path

import nbformat

from labkit import i18n, lab_time

__all__ = ["BEGIN", "END", "CourseError", "strip_solutions", "make_lab", "build_labs",
           "exercises", "REFERENCES", "hardware_needs", "hardware_skip_reason"]

REFERENCES = Path(__file__).resolve().parent / "references"
_WRITEFILE = re.compile(r"^%%writefile\s+(?:-a\s+)?(\S+)\s*$")
_CHECK_CALL = re.compile(r"\bchecks\.(\w+)\(")
_CHECKS_IMPORT = re.compile(r"from labkit\.checks import (\w+) as checks")
_TITLE = re.compile(r"^#+\s*(Exercise\s+\d+\.\d+.*?)\s*$", re.MULTILINE)

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CODE_STUB = ["# YOUR CODE HERE", "raise NotImplementedError()"]
TEXT_STUB = ["YOUR ANSWER HERE"]


class CourseError(ValueError):
    """Malformed solution markers; the message names the notebook and the cell."""


def strip_solutions(source: str, stub: list[str], where: str = "") -> tuple[str, bool]:
    """Replace each marked region with ``stub`` at the marker's indent; say if any."""
    lines, out, inside, replaced = source.splitlines(), [], False, False
    for line in lines:
        marker = line.strip()
        if marker == BEGIN:
            if inside:
                raise CourseError(f"{where}: nested {BEGIN!r}.")
            inside, replaced = True, True
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + s for s in stub]
        elif marker == END:
            if not inside:
                raise CourseError(f"{where}: {END!r} without {BEGIN!r}.")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise CourseError(f"{where}: {BEGIN!r} is never closed by {END!r}.")
    return "\n".join(out), replaced


def make_lab(solution: nbformat.NotebookNode, name: str = "") -> nbformat.NotebookNode:
    """Return the learner version of a solution notebook (a new object)."""
    lab = nbformat.from_dict(solution)
    for index, cell in enumerate(lab.cells):
        stub = CODE_STUB if cell.cell_type == "code" else TEXT_STUB
        cell.source, _ = strip_solutions(cell.source, stub, f"{name} cell {index}")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
    return lab


def _render(notebook) -> str:
    return nbformat.writes(notebook) + "\n"


# ---------------------------------------------------------------- exercises


def _defined_names(source: str) -> list[str]:
    """Return the functions, classes and variables a cell defines at top level."""
    import ast

    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def exercises(solution: nbformat.NotebookNode, name: str = "") -> list[dict]:
    """Return one record per exercise of a solution notebook, in order.

    An exercise is a code cell holding the solution markers; the next code cell is its
    check (it calls ``checks.<check>(...)``). ``key`` is what ``use_reference`` takes:
    the file a ``%%writefile`` cell writes, else the first name the cell defines.
    ``source`` is the solved code without the markers (and without the magic line).
    """
    found, title = [], ""
    cells = solution.cells
    for index, cell in enumerate(cells):
        if cell.cell_type == "markdown":
            titles = _TITLE.findall(cell.source)
            title = re.sub(r"\s*\(≈[^)]*\)$", "", titles[-1]) if titles else title
            continue
        if BEGIN not in cell.source:
            continue
        where = f"{name} cell {index}"
        solved = "\n".join(line for line in cell.source.splitlines()
                           if line.strip() not in (BEGIN, END))
        first, _, rest = solved.partition("\n")
        writes = _WRITEFILE.match(first)
        if writes:
            key, kind, code = Path(writes.group(1)).name, "file", rest
        else:
            defined = _defined_names(solved)
            if not defined:
                raise CourseError(f"{where}: an exercise cell must define a function "
                                  "or write a file, so that it has a reference name.")
            key, kind, code = defined[0], "cell", solved
        following = [i for i in range(index + 1, len(cells))
                     if cells[i].cell_type == "code"]
        check = _CHECK_CALL.search(cells[following[0]].source) if following else None
        if check is None:
            raise CourseError(f"{where}: the next code cell must call its check "
                              "(`checks.<name>(...)`).")
        found.append({"key": key, "kind": kind, "file": writes.group(1) if writes
                      else None, "title": title, "check": check.group(1),
                      "cell": index, "check_cell": following[0], "source": code})
    return found


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


def references(solution: nbformat.NotebookNode, name: str) -> str:
    """Return the reference store of one lab (JSON text): its exercises' solved code."""
    setup = next((c.source for c in solution.cells if c.cell_type == "code"), "")
    module = _CHECKS_IMPORT.search(setup)
    store = {"notebook": name, "checks": module.group(1) if module else None,
             "exercises": [{k: ex[k] for k in ("key", "kind", "file", "title",
                                               "check", "source")}
                           for ex in exercises(solution, name)]}
    return json.dumps(store, indent=1, ensure_ascii=False) + "\n"


def _refresh(target: Path, text: str, check: bool, changed: list) -> None:
    """Write ``text`` to ``target`` unless it is already there (or only checking)."""
    if target.exists() and target.read_text() == text:
        return
    changed.append(target)
    if not check:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def build_labs(
    solutions_dir="solutions", labs_dir="labs", check: bool = False,
    references_dir=None,
) -> list[Path]:
    """Write labs/ from solutions/; return the files that changed (or would, with check).

    Also refreshes the solutions' nbgrader metadata and, when ``references_dir`` is
    given (the CLI gives labkit's own), the reference store of each lab. A lab with no
    solution behind it counts as stale (and is deleted when not checking).
    """
    solutions_dir, labs_dir = Path(solutions_dir), Path(labs_dir)
    sources = sorted(solutions_dir.glob("*.ipynb"))
    if not sources:
        raise CourseError(f"No notebooks in {solutions_dir}: nothing to build.")
    changed, english = [], {}
    for source in sources:
        solution = nbformat.read(source, as_version=4)
        nbgrader_metadata(solution, source.name)
        lab_time.apply_header(solution)
        english[source.name] = solution
        _refresh(source, _render(solution), check, changed)
        _refresh(labs_dir / source.name, _render(make_lab(solution, source.name)),
                 check, changed)
        if references_dir is not None:
            _refresh(Path(references_dir) / f"{source.stem}.json",
                     references(solution, source.name), check, changed)
    instructors = solutions_dir.parent / "INSTRUCTORS.md"
    if instructors.exists():
        notebooks = {s.name: nbformat.read(s, as_version=4) for s in sources}
        for notebook in notebooks.values():
            lab_time.apply_header(notebook)   # as written above (unless checking)
        _refresh(instructors, lab_time.instructors_text(instructors.read_text(),
                                                        notebooks), check, changed)
    names = {s.name for s in sources}
    for orphan in sorted(labs_dir.glob("*.ipynb")):
        if orphan.name not in names:
            changed.append(orphan)
            if not check:
                orphan.unlink()
    # Translated editions (labkit.i18n): solutions/<lang>/ and labs/<lang>/ from the
    # catalogs in locale/; with check, their untranslated entries count as stale too.
    return changed + i18n.build_translations(english, solutions_dir, labs_dir, check)


# ---------------------------------------------------------------- hardware metadata
# Each solution declares metadata.labkit = {"min_gpus", "cpu_ok", "world_size"}. The
# one rule below decides whether a notebook can run with the GPUs found: the test
# collector (tests/conftest.py) and env/gpu_check.py both ask it.


def hardware_needs(path) -> dict:
    """Return a notebook's metadata.labkit, defaults filled in (no GPU, CPU OK, 1)."""
    meta = json.loads(Path(path).read_text()).get("metadata", {}).get("labkit", {})
    return {"min_gpus": int(meta.get("min_gpus", 0)),
            "cpu_ok": bool(meta.get("cpu_ok", True)),
            "world_size": int(meta.get("world_size", 1))}


def hardware_skip_reason(path, found: int) -> str | None:
    """Say why notebook ``path`` cannot run with ``found`` GPUs; None when it can."""
    needs, name = hardware_needs(path), Path(path).name
    if needs["min_gpus"] > found:
        return (f"{name} needs {needs['min_gpus']} GPU(s) (metadata.labkit.min_gpus), "
                f"this machine has {found}")
    if not needs["cpu_ok"] and found == 0:
        return f"{name} is GPU-only (metadata.labkit.cpu_ok is false), no GPU found"
    return None
