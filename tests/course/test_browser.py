"""JupyterLab in a real browser: a lab's first cells, labkit's progress bar as a widget.

Starts JupyterLab from this environment on a free localhost port with a token, opens a
copy of a lab in headless Chromium (Debian's `chromium`, driven by Playwright with
`executable_path`; no browser download), runs the cells before its first exercise plus
one `labkit.train.fit` cell, and checks that tqdm's bar rendered as a real ipywidget
(class `widget-hprogress`), not its text fallback, and that no error output appeared.
The screenshot goes to artifacts/browser/ (gitignored).

Chromium: `apt-get install -y chromium` (.ci/run does it when missing).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-dev-shm-usage"]
SETTINGS = {   # JupyterLab user settings, in a temporary settings folder
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
}
PROGRESS_CELL = """\
# Added by tests/test_browser.py: labkit's training loop shows a tqdm progress bar.
import torch
from labkit import data, models, train
bar_train = data.DeviceData.mnist(train=True, limit=6_000)
bar_test = data.DeviceData.mnist(train=False, limit=500)
bar_model = models.small_cnn()
bar_optimizer = torch.optim.SGD(bar_model.parameters(), lr=0.05)
history = train.fit(bar_model, lambda epoch: bar_train.batches(64),
                    lambda: bar_test.batches(500), epochs=1, optimizer=bar_optimizer,
                    plot=False)
"""
# Records, as the page changes, every widget class that appears in an output area.
WATCH_WIDGETS = """() => {
  window.__widgetClasses = new Set();
  const look = () => document.querySelectorAll('.jp-OutputArea-output .jupyter-widgets')
      .forEach(el => el.classList.forEach(c => window.__widgetClasses.add(c)));
  new MutationObserver(look).observe(document.body,
      {childList: true, subtree: true, attributes: true, attributeFilter: ['class']});
}"""
KERNEL_IDLE = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const kernel = panel && panel.sessionContext && panel.sessionContext.session
      && panel.sessionContext.session.kernel;
  return kernel && kernel.status === 'idle';
}"""
RUN_ALL = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
ALL_RAN = """() => {
  const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
  return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
}"""


def _lab_copy(folder: Path, edition: str = "") -> Path:
    """Copy a lab (of ``edition``: "" English, "zh_CN" the Chinese one, in a folder of
    that name as in labs/): the cells before its first exercise, then the progress cell."""
    labs = sorted((ROOT / "labs" / edition).glob("*.ipynb"))
    if not labs:
        pytest.fail(f"no notebook in labs/{edition}: run `labkit build-labs`")
    source = next((p for p in labs if p.name.startswith("01_")), labs[0])
    nb = nbformat.read(source, as_version=4)
    stubs = [i for i, cell in enumerate(nb.cells)
             if "raise NotImplementedError" in cell.source]
    first = stubs[0] if stubs else len(nb.cells)
    nb.cells = nb.cells[:first] + [nbformat.v4.new_code_cell(PROGRESS_CELL)]
    target = folder / edition / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return target


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _settings(folder: Path) -> Path:
    for plugin, values in SETTINGS.items():
        path = folder / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    return folder


def _wait_for_server(url: str, server: subprocess.Popen, seconds: float = 90) -> bool:
    """Wait until the server answers (True), or exits (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer {url} within {seconds} s")


def _start_lab(command: list, env: dict, log: Path, token: str):
    """Start JupyterLab on a free port; return the server and its base URL.

    A port found free can be taken by another process (another test run on the
    machine) before the server binds it: then the server exits saying so, and the
    next free port is tried.
    """
    for _attempt in range(5):
        port = _free_port()
        with open(log, "w") as out:
            server = subprocess.Popen([*command, f"--ServerApp.port={port}"], env=env,
                                      stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        if _wait_for_server(f"{base}/api/status?token={token}", server):
            return server, base
        if f"port {port} is not available" not in log.read_text():
            pytest.fail(f"jupyter lab exited with {server.returncode}: see {log}")
    pytest.fail(f"jupyter lab found no free port in 5 tries: see {log}")


@pytest.fixture(params=["", "zh_CN"], ids=["english", "chinese"])
def lab_server(tmp_path, request):
    """JupyterLab on a free localhost port with a token, serving a temporary folder
    with a copy of lab 01 of one edition (English, or Chinese in zh_CN/)."""
    token = os.urandom(16).hex()
    course, log = tmp_path / "course", tmp_path / "jupyter.log"
    course.mkdir()
    notebook = _lab_copy(course, request.param)
    env = {**os.environ, "LABKIT_QUICK": "1", "LABKIT_OFFLINE": "1",
           "JUPYTERLAB_SETTINGS_DIR": str(_settings(tmp_path / "settings")),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    command = [str(Path(sys.executable).parent / "jupyter-lab"), "--no-browser",
               "--ServerApp.ip=127.0.0.1", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={course}", "--LabApp.expose_app_in_browser=True",
               f"--FileCheckpoints.checkpoint_dir={tmp_path / 'checkpoints'}"]
    if os.geteuid() == 0:
        command.append("--ServerApp.allow_root=True")   # CI and containers run as root
    server, base = _start_lab(command, env, log, token)
    try:
        yield {"url": f"{base}/lab/tree/{notebook.relative_to(course)}?token={token}",
               "log": log, "edition": request.param}
    finally:
        _shutdown(server, f"{base}/api/shutdown", token)


def _shutdown(server: subprocess.Popen, url: str, token: str) -> None:
    """Stop the server (and so its kernels) cleanly, else kill its process group."""
    request = urllib.request.Request(url, method="POST",
                                     headers={"Authorization": f"token {token}"})
    try:
        urllib.request.urlopen(request, timeout=5)
        server.wait(timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:   # it had exited already
            pass
        server.wait()


def _screenshot_progress_bar(page) -> None:
    """Save the bar while on screen (fit closes it when done; the watcher decides)."""
    bar = page.locator(".jp-OutputArea-output .widget-hprogress").first
    try:
        bar.wait_for(timeout=30_000)
        bar.scroll_into_view_if_needed(timeout=2_000)
        page.screenshot(path=str(ARTIFACTS / "progress.png"), timeout=5_000)
    except Exception as err:   # noqa: BLE001 (any Playwright error: the bar had gone)
        print(f"no screenshot of the progress bar: {type(err).__name__}: {err}")


def _browser_or_skip():
    """Return Playwright's sync API; skip without Chromium, except in CI: fail there.

    CI (the variable CI set, as GitHub Actions and most runners do) installs Chromium
    on purpose, so its absence there is a broken lane, not a reason to skip.
    """
    if not CHROMIUM.exists():
        message = (f"{CHROMIUM} is missing: install it with "
                   "`apt-get install -y chromium` (.ci/run does this in CI)")
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"CI is set and {message}")
        pytest.skip(message)
    return pytest.importorskip("playwright.sync_api")


def test_missing_chromium_fails_in_ci_and_skips_elsewhere(monkeypatch, tmp_path):
    """Without Chromium: a skip on a laptop, a failure when CI is set?"""
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-chromium is missing"):
        _browser_or_skip()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set and .*no-chromium"):
        _browser_or_skip()


def test_lab_runs_in_chromium_with_widget_progress_bar(lab_server):
    """Does a lab run in JupyterLab in Chromium, with labkit's bar as a real widget?"""
    playwright_api = _browser_or_skip()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    edition = lab_server["edition"]
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(lab_server["url"])
            page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=60_000)
            page.wait_for_function(KERNEL_IDLE, timeout=60_000)
            page.evaluate(WATCH_WIDGETS)
            page.evaluate(RUN_ALL)   # returns at once; ALL_RAN waits for the cells
            _screenshot_progress_bar(page)
            page.wait_for_function(ALL_RAN, timeout=120_000, polling=250)
            page.wait_for_function(KERNEL_IDLE, timeout=60_000)
            page.locator(".jp-CodeCell").last.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / f"lab{edition and '-' + edition}.png"))
            page.locator(".jp-MarkdownCell").first.scroll_into_view_if_needed()
            header = page.locator(".jp-MarkdownCell").first.inner_text()
            if edition:   # the header, where the glyphs are seen
                page.screenshot(path=str(ARTIFACTS / f"lab-{edition}-header.png"))
            seen = set(page.evaluate("[...window.__widgetClasses]"))
            outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
            errors = page.locator(
                "[data-mime-type='application/vnd.jupyter.error']").all_inner_texts()
        finally:
            browser.close()
    text = "\n".join(outputs)
    assert not errors, f"error output in the notebook:\n{errors}"
    for bad in ("Error displaying widget", "IProgress not found", "Traceback"):
        assert bad not in text, f"{bad!r} in the outputs:\n{text}"
    assert "widget-hprogress" in seen, f"no progress widget; saw {sorted(seen)}"
    if edition:   # the Chinese lab: its text, and labkit's own lines, in Chinese
        assert header.startswith("实验 01"), header[:200]
        assert "模式：快速" in text, "begin() did not speak Chinese in labs/zh_CN/"
        return
    assert "Mode: QUICK" in text, "the setup cell's labkit.begin() output is missing"
    assert "images/s on cpu" in text or "images/s on cuda" in text, text


def test_a_cjk_font_is_there_for_the_chinese_edition():
    """Chromium and matplotlib draw Chinese with a CJK font (fonts-noto-cjk), not
    boxes: is one installed where the browser test runs?"""
    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True,
                           text=True).stdout if shutil.which("fc-list") else ""
    if not fonts.strip():
        message = ("no CJK font: install fonts-noto-cjk (apt-get install -y "
                   "fonts-noto-cjk; .ci/run does this in CI)")
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"CI is set and {message}")
        pytest.skip(message)
    assert "Noto" in fonts or "CJK" in fonts, fonts
