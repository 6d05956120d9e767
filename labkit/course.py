"""Build the learner notebooks in labs/ from the solved ones in solutions/.

Taught in: nowhere (instructor tooling). One source of truth, nbgrader's convention:
code between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes a stub that raises
``NotImplementedError``; markdown between the markers becomes "YOUR ANSWER HERE".
Outputs are cleared. ``build_labs(check=True)`` reports stale labs without writing.
"""

import json
from pathlib import Path

import nbformat

__all__ = ["BEGIN", "END", "CourseError", "strip_solutions", "make_lab", "build_labs",
           "hardware_needs", "hardware_skip_reason"]

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


def build_labs(
    solutions_dir="solutions", labs_dir="labs", check: bool = False
) -> list[Path]:
    """Write labs/ from solutions/; return the labs that changed (or would, with check).

    A lab with no solution behind it counts as stale (and is deleted when not checking).
    """
    solutions_dir, labs_dir = Path(solutions_dir), Path(labs_dir)
    sources = sorted(solutions_dir.glob("*.ipynb"))
    if not sources:
        raise CourseError(f"No notebooks in {solutions_dir}: nothing to build.")
    changed = []
    for source in sources:
        text = _render(make_lab(nbformat.read(source, as_version=4), source.name))
        target = labs_dir / source.name
        if not target.exists() or target.read_text() != text:
            changed.append(target)
            if not check:
                labs_dir.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
    names = {s.name for s in sources}
    for orphan in sorted(labs_dir.glob("*.ipynb")):
        if orphan.name not in names:
            changed.append(orphan)
            if not check:
                orphan.unlink()
    return changed


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
