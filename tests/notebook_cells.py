"""Read the solution notebooks' cells from tests: the source of truth for exercises.

Program exercises are ``%%writefile NAME.py`` cells. ``write_program`` writes one to
a folder, optionally with a deliberate mistake (a text replacement that must apply
exactly once), so a test can prove the check names that mistake.
"""

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
WRITEFILE = re.compile(r"^%%writefile\s+(?:-a\s+)?(\S+)\s*$")


def code_cells(notebook: str, folder: str = "solutions") -> list[str]:
    """Return the sources of a notebook's code cells (``notebook``: file name)."""
    nb = nbformat.read(ROOT / folder / notebook, as_version=4)
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def program_source(notebook: str, module: str, folder: str = "solutions") -> str:
    """Return the Python a ``%%writefile <module>`` cell writes (magic line dropped)."""
    for source in code_cells(notebook, folder):
        first, _, rest = source.partition("\n")
        match = WRITEFILE.match(first)
        if match and Path(match.group(1)).name == module:
            return rest
    raise LookupError(f"{notebook} has no `%%writefile {module}` cell")


def write_program(folder: Path, notebook: str, module: str,
                  replace: list[tuple[str, str]] = (),
                  source_folder: str = "solutions") -> Path:
    """Write the module a notebook's cell writes into ``folder``, mistakes applied."""
    source = program_source(notebook, module, source_folder)
    for old, new in replace:
        count = source.count(old)
        assert count == 1, f"{module}: {old!r} appears {count} times, not once"
        source = source.replace(old, new)
    path = Path(folder) / module
    path.write_text(source)
    return path


def solution_folder(folder: Path, monkeypatch, notebook: str, modules) -> Path:
    """Write a notebook's ``%%writefile`` modules into ``folder`` and work from there.

    The checks then find the modules as the notebook's cells leave them: next to the
    working directory.
    """
    monkeypatch.chdir(folder)
    for module in modules:
        write_program(folder, notebook, module)
    return Path(folder)


def expect_hint(check, path: Path, hint: str) -> None:
    """Run ``check`` on the module at ``path``; it must fail, matching ``hint``."""
    import pytest

    from labkit.checks import ExerciseFailed

    with pytest.raises(ExerciseFailed, match=hint):
        check(str(path))
