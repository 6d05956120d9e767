"""The course book, read as a user reads it: built in quick mode, opened in Chromium.

`labkit book` (what `make book` runs) builds every solution notebook, executed, into a
static site, in English and in Chinese. Here it is built once in quick mode, offline,
into a temporary folder; then headless Chromium (Debian's, as in test_browser.py) opens
its pages and checks, in both editions: lab 05's page renders with its images (its Gantt
charts; screenshots go to artifacts/book/), every internal link resolves (the language
switch included), the search finds "DistributedSampler" (and, in Chinese, 流水线),
and no cell output on any lab page is an error.
"""

import os
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from labkit.checks._programs import run_command
from course.test_browser import CHROMIUM, CHROMIUM_FLAGS, _browser_or_skip

ROOT = Path(__file__).resolve().parents[2]
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
    """Does the site hold a page per lab in both editions, and the README's sections?"""
    names = sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))
    assert sorted(p.stem for p in (book / "labs").glob("*.html")) == names
    assert sorted(p.stem for p in (book / "zh_CN" / "labs").glob("*.html")) == names
    for page in ("setup", "hardware", "launcher", "benchmarks", "environments",
                 "instructors", "colab", "zh_CN/index", "zh_CN/setup"):
        assert (book / f"{page}.html").exists(), page
    lab = (book / "labs" / "03_ddp.html").read_text()
    assert "Numbers on this page" in lab and "gloo" in lab
    assert "Run this lab yourself" in lab


def test_chinese_pages_show_labkits_own_output_in_chinese(book):
    """The Chinese pages ran in Chinese: begin()'s lines and the machine note."""
    lab = (book / "zh_CN" / "labs" / "03_ddp.html").read_text()
    assert "本页的数字" in lab and "gloo" in lab and "自己运行这个实验" in lab
    assert "模式：快速" in lab, "begin() did not speak Chinese on the Chinese page"
    assert "Mode: QUICK" not in lab
    english = (book / "labs" / "03_ddp.html").read_text()
    assert "模式：快速" not in english   # two caches: the outputs were not shared


def _internal_links(page) -> list[str]:
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    return [h for h in hrefs if h.startswith("file://")]


def test_book_in_chromium(book):
    """Images on lab 05, links that resolve, search, and no error output: both editions."""
    playwright = _browser_or_skip()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pages = [p for site in (book, book / "zh_CN")
             for p in sorted(site.glob("*.html")) + sorted((site / "labs").glob("*.html"))]
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            for site, shot in ((book, "lab05.png"), (book / "zh_CN", "lab05-zh_CN.png")):
                page.goto((site / "labs" / "05_pipeline_parallel.html").as_uri())
                images = page.eval_on_selector_all(
                    "main img", "els => els.filter(e => e.complete && e.naturalWidth > 0).length")
                assert images >= 2, f"{site.name}: lab 05 shows {images} images (its Gantt charts?)"
                page.screenshot(path=str(ARTIFACTS / shot), full_page=True)

            broken = set()
            for html in pages:
                page.goto(html.as_uri())
                for href in _internal_links(page):
                    target = Path(unquote(urlparse(href).path))
                    if not target.exists():
                        broken.add(f"{html.relative_to(book)} -> {href}")
                if html.parent.name == "labs":
                    errors = page.eval_on_selector_all(
                        ".output.traceback, .output.error", "els => els.length")
                    assert errors == 0, f"{html.relative_to(book)}: {errors} error output(s)"
                    assert "Error displaying widget" not in page.inner_text("main")
            assert not broken, f"broken internal links: {sorted(broken)[:10]}"

            # the language switch: each lab page links to the same lab in the other edition
            page.goto((book / "labs" / "03_ddp.html").as_uri())
            page.click("a[hreflang=zh]")
            assert page.url.endswith("/zh_CN/labs/03_ddp.html"), page.url
            page.click("a[hreflang=en]")
            assert page.url == (book / "labs" / "03_ddp.html").as_uri(), page.url

            for site, query, lab in ((book, "DistributedSampler", "03_ddp"),
                                     (book / "zh_CN", "DistributedSampler", "03_ddp"),
                                     (book / "zh_CN", "流水线", "05_pipeline")):
                page.goto((site / "search.html").as_uri() + f"?q={query}")
                page.wait_for_selector("#search-results li", timeout=30_000)
                found = page.eval_on_selector_all("#search-results li a",
                                                  "els => els.map(e => e.href)")
                assert any(lab in href for href in found), (site.name, query, found)
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
