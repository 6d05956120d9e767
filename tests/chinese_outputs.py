"""The nbval hook that fails a Chinese notebook's cell when it shows English prose.

``make test`` runs every ``solutions/zh_CN`` notebook under nbval (quick mode).
``EnglishInOutputs`` (registered by tests/conftest.py) looks at each of their cells
right after nbval ran it, in the same kernel, so nothing runs twice: the cell's
outputs (``english_prose.shown_texts``), the words of every figure drawn or still open
(its ``Text`` artists: titles, axis and tick labels, legends, annotations, tables) and
the labels of every widget made (descriptions, options, placeholders, tooltips, the
text of labels, HTML widgets and buttons), both read by a probe in the kernel. A cell
that shows English prose (``english_prose.english_runs``, ``label_is_english``) fails,
naming the notebook, the cell and the string.
"""

import json
import time

import pytest

from english_prose import english_runs, label_is_english, shown_texts

__all__ = ["PROBE", "COLLECT", "findings", "EnglishInOutputs"]


# Run in the notebook's kernel. Installed before a cell runs (so that a figure drawn
# and closed inside the cell is still read), read after it. Figure.draw is wrapped to
# read the words of every figure drawn; open figures not drawn yet (the agg backend of
# the tests) are drawn without rendering; widgets are read once per change.
PROBE = r'''
import sys as _sys
if "_labkit_output_probe" not in _sys.modules:
    import types as _types
    _module = _types.ModuleType("_labkit_output_probe")
    exec(compile(r"""
import json, sys

drawn, seen = [], set()


def texts(fig):
    from matplotlib.text import Text
    return [t.get_text() for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip()]


def patch():
    from matplotlib.figure import Figure
    if getattr(Figure.draw, "_labkit_probe", False):
        return
    original = Figure.draw

    def draw(self, renderer):
        result = original(self, renderer)
        drawn.extend(texts(self))
        return result

    draw._labkit_probe = True
    Figure.draw = draw


def widget_labels(widget):
    from ipywidgets import HTML, HTMLMath, Label, Button
    import html
    import re
    labels = [getattr(widget, name, "") for name in ("description", "tooltip",
                                                     "placeholder")]
    labels += [str(o) for o in getattr(widget, "_options_labels", ())]
    if isinstance(widget, (HTML, HTMLMath, Label)):
        labels.append(html.unescape(re.sub(r"<[^>]+>", " ", str(widget.value))))
    return [x for x in labels if isinstance(x, str) and x.strip()]


def collect():
    if "matplotlib.pyplot" in sys.modules:
        from matplotlib._pylab_helpers import Gcf
        for manager in Gcf.get_all_fig_managers():
            if manager.canvas.figure.stale:
                manager.canvas.figure.draw_without_rendering()
    plots = list(dict.fromkeys(drawn))
    drawn.clear()
    widgets = []
    if "ipywidgets" in sys.modules:
        from ipywidgets.widgets import widget as module
        for instance in list(getattr(module, "_instances", {}).values()):
            for label in widget_labels(instance):
                if (instance.model_id, label) not in seen:
                    seen.add((instance.model_id, label))
                    widgets.append(label)
    return json.dumps({"plot": plots, "widget": widgets})
""", "<labkit output probe>", "exec"), _module.__dict__)
    _sys.modules["_labkit_output_probe"] = _module
    del _types, _module
import _labkit_output_probe
_labkit_output_probe.patch()
del _labkit_output_probe
'''
COLLECT = "__import__('_labkit_output_probe').collect()"


def _ask(kernel, code: str, expression: str | None = None, timeout: float = 300):
    """Run ``code`` silently in nbval's kernel (no output, no history, ``_`` kept);
    return ``expression``'s value (a string) when one is given."""
    msg_id = kernel.kc.execute(code, silent=True, store_history=False,
                               user_expressions={"value": expression} if expression
                               else {}, allow_stdin=False, stop_on_error=False)
    while True:
        reply = kernel.get_message(stream="shell", timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    content = reply["content"]
    if content.get("status") != "ok":
        raise RuntimeError(f"the output probe failed in the kernel: "
                           f"{content.get('ename')}: {content.get('evalue')}")
    if expression is None:
        return None
    value = content["user_expressions"]["value"]
    if value.get("status") != "ok":
        raise RuntimeError(f"the output probe failed in the kernel: "
                           f"{value.get('ename')}: {value.get('evalue')}")
    import ast

    return ast.literal_eval(value["data"]["text/plain"])


def findings(outputs, probed: dict) -> list[str]:
    """Say each English string a cell showed: '<kind>: <run> in <string>'."""
    found = []
    for kind, text in shown_texts(outputs):
        for line in text.splitlines():
            for run in english_runs(line):
                found.append(f"{kind}: {run!r} in {line.strip()[:160]!r}")
    for kind in ("plot", "widget"):
        found += [f"{kind} text: {label[:160]!r}" for label in probed.get(kind, [])
                  if label_is_english(label)]
    return list(dict.fromkeys(found))


def _is_chinese_cell(item) -> bool:
    notebook = getattr(item.parent, "nb", None)
    return (type(item).__name__ == "IPyNbCell" and notebook is not None
            and notebook.metadata.get("labkit", {}).get("lang") == "zh_CN")


class EnglishInOutputs:
    """The nbval hook: a Chinese notebook's cell fails when it shows English prose.

    What it costs is reported at the end of the run (the probes' seconds, summed over
    the cells; with pytest-xdist, carried back in each report's user_properties)."""

    def __init__(self):
        self.cells, self.seconds = 0, 0.0

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        if not _is_chinese_cell(item) or item.options.get("skip"):
            return (yield)
        kernel = item.parent.kernel
        start = time.perf_counter()
        _ask(kernel, PROBE)
        spent = time.perf_counter() - start
        result = yield                   # the cell ran (an error has already failed it)
        start = time.perf_counter()
        probed = json.loads(_ask(kernel, "", COLLECT))
        found = findings(item.test_outputs or [], probed)
        item.user_properties.append(("english_probe_s",
                                     spent + time.perf_counter() - start))
        if found:
            where = f"{item.path.name} {item.name} (cell id {item.cell.get('id')})"
            raise AssertionError(
                f"{where} shows English prose in the Chinese edition:\n  "
                + "\n  ".join(found) + "\nTranslate it: its string in the lab's "
                "catalog (a code cell's words, msgctxt '<cell id> code') or in "
                "labkit.po (labkit's own words), then `labkit build-labs` "
                "(locale/README.md).")
        return result

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            spent = [v for k, v in report.user_properties if k == "english_probe_s"]
            self.cells += len(spent)
            self.seconds += sum(spent)

    def pytest_terminal_summary(self, terminalreporter):
        if self.cells:
            terminalreporter.write_line(
                f"English in the Chinese outputs: {self.cells} cells looked at, "
                f"{self.seconds:.1f} s in the kernel probes")
