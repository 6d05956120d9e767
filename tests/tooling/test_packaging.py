"""pyproject.toml (labkit) and tooling/pyproject.toml (coursetools) declare what each
package and the tests import."""

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
TOOLING = tomllib.loads((ROOT / "tooling" / "pyproject.toml").read_text())
# import name -> distribution name, where they differ
DISTRIBUTION = {"PIL": "pillow", "yaml": "pyyaml", "IPython": "ipython",
                "jupyter_client": "jupyter-client"}
OPTIONAL = {"playwright"}   # tests/test_browser.py skips without it (importorskip)


def _imports(folder: Path) -> set[str]:
    """Return the top-level modules imported anywhere under ``folder``."""
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def _notebook_modules() -> set[str]:
    """The modules the labs' %%writefile cells write (the alternatives import them)."""
    from notebook_cells import WRITEFILE, code_cells

    return {Path(match.group(1)).stem
            for notebook in (ROOT / "solutions").glob("*.ipynb")
            for source in code_cells(notebook.name)
            if (match := WRITEFILE.match(source.partition("\n")[0]))}


def _third_party(names: set[str]) -> set[str]:
    local = ({"labkit", "coursetools", "conftest"}
             | {p.stem for p in (ROOT / "tests").rglob("*.py")}
             | {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()}   # layers
             | _notebook_modules())
    return {n for n in names if n not in sys.stdlib_module_names and n not in local}


def _declared(*groups: str, pyproject=PYPROJECT) -> set[str]:
    project = pyproject["project"]
    requirements = list(project["dependencies"])
    for group in groups:
        requirements += project["optional-dependencies"][group]
    return {req.split(">")[0].split("=")[0].split("<")[0].strip().lower()
            for req in requirements}


def _distribution(module: str) -> str:
    return DISTRIBUTION.get(module, module).lower().replace("_", "-")


def test_labkit_imports_are_all_declared():
    """Is every package labkit imports a dependency in pyproject.toml?"""
    declared = {d.replace("_", "-") for d in _declared()}
    missing = {m for m in _third_party(_imports(ROOT / "labkit"))
               if _distribution(m) not in declared}
    assert not missing, f"labkit imports undeclared packages: {sorted(missing)}"


def test_tooling_imports_are_all_declared():
    """Is every package coursetools imports a dependency in tooling/pyproject.toml
    (its book extra included), or labkit's (which it depends on)?"""
    declared = {d.replace("_", "-") for d in _declared("book", pyproject=TOOLING)
                | _declared()}
    assert "labkit" in declared
    missing = {m for m in _third_party(_imports(ROOT / "tooling" / "coursetools"))
               if _distribution(m) not in declared}
    assert not missing, f"coursetools imports undeclared packages: {sorted(missing)}"


def test_test_imports_are_in_the_test_extra():
    """Does `pip install .[test]` bring everything the tests import?"""
    declared = {d.replace("_", "-") for d in _declared("test")}
    missing = {m for m in _third_party(_imports(ROOT / "tests")) - OPTIONAL
               if _distribution(m) not in declared}
    assert not missing, f"tests import packages outside [test]: {sorted(missing)}"


def test_requires_python_admits_this_python():
    """Is the Python running the tests one that requires-python names?"""
    spec = PYPROJECT["project"]["requires-python"]
    assert spec == ">=3.11,<3.14"
    assert (3, 11) <= sys.version_info[:2] < (3, 14)


def test_the_learner_install_holds_the_runtime_and_rooms_but_no_tooling(tmp_path):
    """Does `pip install .` (what the learner image runs) install labkit with every
    room and its references, and nothing of the tooling, the solutions or the tests?"""
    import subprocess
    import zipfile

    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = tmp_path.glob("labkit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "labkit/launch.py" in names and "labkit/labs/ddp/checks.py" in names
    from labkit.labs import ROOMS

    assert {f"labkit/labs/{room}/reference.json" for room in ROOMS} <= set(names)
    assert "labkit/locale/zh_CN/LC_MESSAGES/labkit.po" in names
    assert not [n for n in names if n.startswith(("coursetools", "tooling", "tests",
                                                  "solutions"))]
