"""Solution notebooks and what is made from them: the learner version, the exercises.

Taught in: nowhere (course tooling). nbgrader's convention: code between
``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes a stub that raises
``NotImplementedError``; markdown between the markers becomes "YOUR ANSWER HERE".
``exercises`` finds each exercise (its cell, its check, its reference key); each
notebook's ``metadata.labkit`` says what hardware it needs. ``coursetools.build``
and ``coursetools.i18n`` both make learner notebooks with these.
"""

import json
import re
from pathlib import Path

import nbformat

__all__ = ["BEGIN", "END", "CourseError", "strip_solutions", "make_lab", "render",
           "refresh", "replace_block", "exercises", "hardware_needs",
           "hardware_skip_reason"]

_WRITEFILE = re.compile(r"^%%writefile\s+(?:-a\s+)?(\S+)\s*$")
_CHECK_CALL = re.compile(r"\bchecks\.(\w+)\(")
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


def make_lab(solution: nbformat.NotebookNode, name: str = "",
             stubs: tuple = (CODE_STUB, TEXT_STUB)) -> nbformat.NotebookNode:
    """Return the learner version of a solution notebook (a new object); ``stubs``:
    the (code, text) stubs, a translated edition's own."""
    lab = nbformat.from_dict(solution)
    for index, cell in enumerate(lab.cells):
        stub = stubs[0] if cell.cell_type == "code" else stubs[1]
        cell.source, _ = strip_solutions(cell.source, stub, f"{name} cell {index}")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
    return lab




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


def render(notebook) -> str:
    return nbformat.writes(notebook) + "\n"


def refresh(target: Path, text: str, check: bool, changed: list) -> None:
    """Write ``text`` to ``target`` unless it is already there (or only checking)."""
    if target.exists() and target.read_text() == text:
        return
    changed.append(target)
    if not check:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def replace_block(text: str, tag: str, body: str, where: str) -> str:
    """Replace what stands between ``<!-- tag...-->`` and ``<!-- /tag -->`` in the text
    of ``where`` (a generated block of a markdown file, e.g. INSTRUCTORS.md's tables)."""
    pattern = re.compile(rf"(<!-- {tag}\b[^>]*-->\n)(.*?)(<!-- /{tag} -->)", re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{where} has no <!-- {tag} --> ... <!-- /{tag} --> block")
    return pattern.sub(lambda m: m.group(1) + body + m.group(3), text, count=1)


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
