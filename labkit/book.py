"""The course as a book: a static site of every lab, executed, with its outputs.

Taught in: nowhere (the course's reading edition; ``make book``). Sphinx with myst-nb
builds ``book/`` and the solution notebooks into ``build/book/<mode>/html``: each
notebook runs once per mode (full by default, quick with ``LABKIT_QUICK=1``) and is
cached by jupyter-cache, so a second build runs only the notebooks whose code changed.

Each lab page gets two cells before its title: how to open the learner notebook (an
nbgitpuller link when the hub and repository are set, else the local command), and,
printed when the notebook runs, the machine that produced its numbers. The executed
notebooks and the HTML pages are zipped for instructors (``instructor-bundle.zip``).
"""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from urllib.parse import quote, urlencode

import nbformat

from labkit.course import BEGIN, END

__all__ = ["build", "prepare_sources", "launch_cell", "machine_cell"]

ROOT = Path(__file__).resolve().parents[1]
HUB_ENV, REPO_ENV = "LABKIT_BOOK_HUB", "LABKIT_BOOK_REPO"

MACHINE_CODE = '''\
# Added by labkit.book: which machine produced this page's numbers.
import datetime, torch
from IPython.display import Markdown
from labkit import lab_time, mode
_where = lab_time.machine()
_gpus = torch.cuda.device_count()
_mode = "quick mode (shrunk data and steps)" if mode.is_quick() else "full mode"
_note = (f"**Numbers on this page** were produced on {_where['on']} ({_where['cpu']}), "
         f"torch {_where['torch']}, in {_mode}, on {datetime.date.today()}: "
         + (f"{_gpus} GPU(s), NCCL between GPU ranks." if _gpus else
            "no GPU, so every rank is a CPU process on the gloo backend. GPU figures "
            "would differ (speed-ups, bandwidths, memory): see {compare}."))
Markdown(_note)
'''


def _slug(heading: str) -> str:
    """The anchor myst-parser gives a heading (GitHub's style)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _compare_link(nb) -> str:
    """A link to the lab's comparison with the field (its GPU figures), if it has one."""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            match = re.match(r"^#{2,4}\s+(.*field.*)$", line, re.IGNORECASE)
            if match:
                return f"[this lab's comparison with the field](#{_slug(match.group(1))})"
    return "the lab's appendix"


def launch_cell(name: str) -> str:
    """The markdown that opens the learner notebook ``labs/<name>``."""
    hub, repo = os.environ.get(HUB_ENV, ""), os.environ.get(REPO_ENV, "")
    local = f"locally: `make lab`, then open `labs/{name}`"
    if hub and repo:
        folder = repo.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
        query = urlencode({"repo": repo, "branch": "main",
                           "urlpath": f"lab/tree/{folder}/labs/{name}"}, quote_via=quote)
        hub_link = f"[Open on JupyterHub]({hub.rstrip('/')}/hub/user-redirect/git-pull?{query})"
    else:
        hub_link = ("JupyterHub link: not configured for this build (set "
                    f"`{HUB_ENV}` and `{REPO_ENV}`, see [Opening a lab](../colab.md))")
    return (f"**Run this lab yourself:** {hub_link} · {local} · "
            "[on Colab](../colab.md)")


def machine_cell(nb) -> nbformat.NotebookNode:
    """The code cell that prints, when it runs, where this page's numbers came from."""
    cell = nbformat.v4.new_code_cell(MACHINE_CODE.replace("{compare}",
                                                          _compare_link(nb)))
    cell.metadata["tags"] = ["remove-input"]
    return cell


def prepare_sources(target: Path) -> Path:
    """Fill ``target`` with the book's pages, README, INSTRUCTORS.md and the labs."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(ROOT / "book", target)
    for page in ("README.md", "INSTRUCTORS.md"):
        shutil.copy(ROOT / page, target / page)
    (target / "labs").mkdir()
    for source in sorted((ROOT / "solutions").glob("*.ipynb")):
        nb = nbformat.read(source, as_version=4)
        for cell in nb.cells:   # a reading edition: the solved code, without markers
            if cell.cell_type == "code" and BEGIN in cell.source:
                cell.source = "\n".join(line for line in cell.source.splitlines()
                                        if line.strip() not in (BEGIN, END))
        nb.cells[:0] = [nbformat.v4.new_markdown_cell(launch_cell(source.name)),
                        machine_cell(nb)]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        nbformat.write(nb, target / "labs" / source.name)
    return target


def _bundle(out: Path) -> Path:
    """Zip the executed notebooks and the HTML pages for instructors."""
    bundle = out / "instructor-bundle.zip"
    executed = out / "html" / "_sources" / "labs"
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted((out / "jupyter_execute" / "labs").glob("*.ipynb")):
            archive.write(path, f"notebooks/{path.name}")
        for path in sorted((out / "html").rglob("*")):
            if path.is_file() and executed not in path.parents:
                archive.write(path, f"html/{path.relative_to(out / 'html')}")
    return bundle


def build(out: Path | None = None) -> Path:
    """Build the book for the current mode; return its HTML folder."""
    from labkit import mode

    kind = "quick" if mode.is_quick() else "full"
    out = Path(out) if out else ROOT / "build" / "book" / kind
    sources = prepare_sources(out / "src")
    env = dict(os.environ, LABKIT_BOOK_CACHE=str(out / "cache"), LABKIT_STATIC="1")
    env.pop("MPLBACKEND", None)   # the kernel's inline backend draws the figures
    print(f"Building the book in {kind} mode into {out / 'html'} (notebooks cached in "
          f"{out / 'cache'}).", flush=True)
    subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q",
                    "-d", str(out / "doctrees"), str(sources), str(out / "html")],
                   env=env, check=True)
    print(f"Book: {out / 'html' / 'index.html'}; instructor bundle: {_bundle(out)}")
    return out / "html"
