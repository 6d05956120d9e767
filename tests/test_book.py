"""The course book, read as a user reads it: built in quick mode, opened in Chromium.

`labkit book` (what `make book` runs) builds every solution notebook, executed, into a
static site. Here it is built once in quick mode, offline, into a temporary folder;
then headless Chromium (Debian's, as in test_browser.py) opens its pages and checks
four things: lab 05's page renders with its images (its Gantt charts; a screenshot goes
to artifacts/book/), every internal link resolves, the search finds
"DistributedSampler", and no cell output on any lab page is an error.
"""

import os
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from labkit.checks._programs import run_command
from test_browser import CHROMIUM, CHROMIUM_FLAGS, _browser_or_skip

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts" / "book"

pytest.importorskip("myst_nb", reason="the book needs sphinx and myst-nb (pip install .[book])")
# Building runs every notebook once (quick mode): minutes, not the suite's default 10.
pytestmark = pytest.mark.timeout(2400)


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Path:
    """Build the quick-mode book once, with the same command as `make book`."""
    out = tmp_path_factory.mktemp("book")
    env = dict(os.environ, LABKIT_QUICK="1", LABKIT_OFFLINE="1")
    # run_command stops the build and every kernel below it on a timeout or interrupt
    done = run_command([sys.executable, "-m", "labkit.cli", "book", "--out", str(out)],
                       timeout=2000, cwd=ROOT, env=env)
    assert done.returncode == 0, f"the book did not build:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert (out / "instructor-bundle.zip").stat().st_size > 0
    return out / "html"


def test_book_has_every_lab_and_the_readme_pages(book):
    """Does the site hold a page per lab and the README's sections?"""
    labs = sorted(p.stem for p in (book / "labs").glob("*.html"))
    assert labs == sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))
    for page in ("setup", "hardware", "launcher", "benchmarks", "environments",
                 "instructors", "colab"):
        assert (book / f"{page}.html").exists(), page
    lab = (book / "labs" / "03_ddp.html").read_text()
    assert "Numbers on this page" in lab and "gloo" in lab
    assert "Run this lab yourself" in lab


def _internal_links(page) -> list[str]:
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    return [h for h in hrefs if h.startswith("file://")]


def test_book_in_chromium(book):
    """Images on lab 05, links that resolve, search, and no error output."""
    playwright = _browser_or_skip()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pages = sorted(book.glob("*.html")) + sorted((book / "labs").glob("*.html"))
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            page.goto((book / "labs" / "05_pipeline_parallel.html").as_uri())
            images = page.eval_on_selector_all(
                "main img", "els => els.filter(e => e.complete && e.naturalWidth > 0).length")
            assert images >= 2, f"lab 05's page shows {images} images (its Gantt charts?)"
            page.screenshot(path=str(ARTIFACTS / "lab05.png"), full_page=True)

            broken = set()
            for html in pages:
                page.goto(html.as_uri())
                for href in _internal_links(page):
                    target = Path(unquote(urlparse(href).path))
                    if not target.exists():
                        broken.add(f"{html.name} -> {href}")
                if html.parent.name == "labs":
                    errors = page.eval_on_selector_all(
                        ".output.traceback, .output.error", "els => els.length")
                    assert errors == 0, f"{html.name}: {errors} error output(s)"
                    assert "Error displaying widget" not in page.inner_text("main")
            assert not broken, f"broken internal links: {sorted(broken)[:10]}"

            page.goto((book / "search.html").as_uri() + "?q=DistributedSampler")
            page.wait_for_selector("#search-results li", timeout=30_000)
            found = page.eval_on_selector_all("#search-results li a", "els => els.map(e => e.href)")
            assert any("03_ddp" in href for href in found), found
        finally:
            browser.close()


def test_pages_workflow_publishes_the_full_book():
    """Does the pages workflow build with `make book` in full mode, under pipefail, and
    say which kind of runner made the numbers?"""
    import yaml

    workflow = yaml.safe_load((ROOT / ".github/workflows/pages.yml").read_text())
    job = workflow["jobs"]["book"]
    runs = [step.get("run", "") for step in job["steps"]]
    assert "make book" in runs and not any("LABKIT_QUICK" in r for r in runs)
    assert "pipefail" in job["defaults"]["run"]["shell"]
    assert any("GPU runner" in r and "CPU runner" in r for r in runs)
    uploaded = [s["with"]["path"] for s in job["steps"] if "upload-pages" in s.get("uses", "")]
    assert uploaded == ["build/book/full/html"]
