"""Install what a JupyterHub rehearsal needs, where learners can read it (for
rehearse.py): build/hub/ with a venv, the proxy, the course and the data.

The venv is made from this machine's own Python of the course's version
(/usr/bin/python3.X: the course's interpreter may live under a private home, such
as pyenv's under /root, mode 0700), and reads the course's packages (torch and the
rest) from the environment running this script, through a .pth file: the
rehearsal installs no second torch. labkit itself is installed into it from this
checkout, not editable, as on a real server; JupyterHub from
env/jupyterhub/requirements-hub.txt; configurable-http-proxy with npm, into
build/hub/proxy (never globally).
"""

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "hub"
REQUIREMENTS = ROOT / "env" / "jupyterhub" / "requirements-hub.txt"
PROXY = "configurable-http-proxy@5.3.0"
# Console scripts of the course's packages that the labs call by path
# (lab 03: Path(sys.executable).parent / "torchrun").
SCRIPTS = {"torchrun": "torch.distributed.run"}


@dataclass(frozen=True)
class Install:
    build: Path
    bin: Path       # the venv's bin: python, jupyterhub, jupyterhub-singleuser
    proxy: Path     # configurable-http-proxy
    course: Path    # COURSE_HOME: labs/ (and env/) as a server would hold them
    data: Path      # COURSE_DATA: MNIST, read-only


def _readable_by_all(path: Path) -> bool:
    """Can any user reach ``path`` (every folder above it o+x, it o+r)?"""
    path = path.resolve()
    for folder in [path, *path.parents]:
        mode = os.stat(folder).st_mode
        if not mode & stat.S_IXOTH or (folder == path and not mode & stat.S_IROTH):
            return False
    return True


def _venv() -> Path:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = Path(f"/usr/bin/python{version}")
    packages = Path(sysconfig.get_paths()["purelib"])
    if not base.exists():
        raise SystemExit(f"{base} is missing: the rehearsal's venv needs a system "
                         f"Python {version} (the course's packages are built for it).")
    if not _readable_by_all(packages):
        raise SystemExit(f"{packages} is not readable by other users: install the "
                         "course where learners can read it (env/jupyterhub/README.md).")
    venv = BUILD / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{version}" / "site-packages"
    (site / "course-packages.pth").write_text(f"{packages}\n")
    return venv


def _pip(venv: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "--quiet", "--disable-pip-version-check", *args],
                   check=True)


def _scripts(venv: Path) -> None:
    """The course's console scripts, for the venv's Python."""
    for name, module in SCRIPTS.items():
        path = venv / "bin" / name
        path.write_text(f"#!{venv}/bin/python\nimport runpy\n"
                        f"runpy.run_module({module!r}, run_name='__main__')\n")
        path.chmod(0o755)


def _proxy() -> Path:
    folder = BUILD / "proxy"
    binary = folder / "node_modules" / ".bin" / "configurable-http-proxy"
    if not binary.exists():
        subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund",
                        "--prefix", str(folder), PROXY], check=True)
    return binary


def _course() -> Path:
    """labs/ as a course install holds them (solutions/ and tests/ stay out)."""
    course = BUILD / "course"
    shutil.rmtree(course, ignore_errors=True)
    shutil.copytree(ROOT / "labs", course / "labs")
    for folder, _subfolders, _files in os.walk(course):
        os.chmod(folder, 0o755)
    return course


def _data() -> Path:
    """MNIST prepared once (checked, unpacked) as the guide says, then read-only for
    everyone: ``labkit data prepare --root``, from this checkout's files."""
    from labkit import data

    data_root = BUILD / "mnist"
    raw = data_root / "MNIST" / "raw"
    if not raw.exists():
        raw.mkdir(parents=True)
        for path in (data.data_root() / "MNIST" / "raw").glob("*.gz"):
            shutil.copy(path, raw / path.name)
        data.prepare(data_root, download=False)
        (raw / ".prepare.lock").unlink(missing_ok=True)
        for folder, _subfolders, files in os.walk(data_root):
            for name in files:
                os.chmod(os.path.join(folder, name), 0o444)
            os.chmod(folder, 0o555)
    return data_root


def install() -> Install:
    """Make build/hub/ ready (quick when it already is) and say where things are."""
    BUILD.mkdir(parents=True, exist_ok=True)
    for folder in (BUILD.parent, BUILD):   # learners pass through to the venv
        os.chmod(folder, 0o755)
    venv = _venv()
    stamp, want = venv / ".hub-requirements", hashlib.sha256(
        REQUIREMENTS.read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text() != want:
        _pip(venv, "-r", str(REQUIREMENTS))
        stamp.write_text(want)
    _pip(venv, "--no-deps", "--no-build-isolation", "--force-reinstall", str(ROOT))
    _scripts(venv)
    return Install(BUILD, venv / "bin", _proxy(), _course(), _data())


def check_cells(lab: str) -> set:
    """The indices of ``lab``'s check cells (from its solution, as the tests do)."""
    import nbformat

    from coursetools import notebooks

    solution = nbformat.read(ROOT / "solutions" / lab, as_version=4)
    return {exercise["check_cell"] for exercise in notebooks.exercises(solution, lab)}
