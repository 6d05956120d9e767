"""coursetools.i18n on code cells and diagrams: a code cell's words go through the
catalog (one entry per string), come back translated in the Chinese solution and in
its learner version, and cannot break the code or drift from the English."""

import nbformat
import polib

from coursetools import i18n, notebooks

HEADER = "# Lab 99 — Tiny\n\nWhy.\n\n**Time:** x. **Hardware:** CPU."
PROGRAM = '''%%writefile tiny.py
"""Lab 99, exercise 99.1: a tiny program."""


def step(x):
    """Return x doubled, on every rank."""
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION
'''
REPORT = ('print(f"rank {rank}: loss {loss:.3f} after {steps} steps")\n'
          'ax.set_title("Gantt")')
DIAGRAM = ("Two ranks:\n\n```text\nrank 0 ──send──▶ rank 1\n"
           "  [forward]   [backward]\n```")
ZH = {"Lab 99, exercise 99.1: a tiny program.": "实验 99，练习 99.1：一个小程序。",
      "Return x doubled, on every rank.": "在每个 rank 上返回 x 的两倍。",
      "rank {rank}: loss {loss:.3f} after {steps} steps":
          "rank {rank}：{steps} 步之后损失为 {loss:.3f}",
      "Gantt": "甘特图"}


def _english() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(HEADER, id="h"),
                nbformat.v4.new_code_cell(PROGRAM, id="prog"),
                nbformat.v4.new_code_cell("checks.step('tiny.py')", id="check"),
                nbformat.v4.new_code_cell(REPORT, id="report"),
                nbformat.v4.new_markdown_cell(DIAGRAM, id="diagram")]
    nb.metadata["labkit"] = {}
    return nb


def _catalog(tmp_path, nb, diagram=None):
    """The notebook's catalog, every entry translated (markdown: prefixed)."""
    po_path = tmp_path / "a.po"
    i18n.update(po_path, nb, "zh_CN", "a")
    po = polib.pofile(str(po_path))
    for entry in po:
        entry.msgstr = ZH.get(entry.msgid, entry.msgid.replace("# Lab", "# 实验"))
        if entry.msgctxt == "diagram" and diagram:
            entry.msgstr = diagram
    po.save()
    return po_path


def test_each_string_of_a_code_cell_is_an_entry_with_its_line(tmp_path):
    """One entry per string, msgctxt '<cell id> code', the line it stands on as the
    translator's note; markdown cells keep theirs."""
    i18n.update(tmp_path / "a.po", _english(), "zh_CN", "a")
    po = polib.pofile(str(tmp_path / "a.po"))
    code = {(e.msgctxt, e.msgid) for e in po if e.msgctxt.endswith(" code")}
    assert code == {("prog code", "Lab 99, exercise 99.1: a tiny program."),
                    ("prog code", "Return x doubled, on every rank."),
                    ("report code", "rank {rank}: loss {loss:.3f} after {steps} steps"),
                    ("report code", "Gantt")}
    gantt = po.find("Gantt", msgctxt="report code")
    assert 'ax.set_title("Gantt")' in gantt.comment
    markdown = {e.msgctxt for e in po if not e.msgctxt.endswith(" code")}
    assert markdown == {"h", "diagram"}


def test_the_chinese_solution_and_lab_say_it_in_chinese(tmp_path):
    """The translated solution prints and documents in Chinese; its learner version
    keeps the translated docstrings around the Chinese stub."""
    nb = _english()
    po_path = _catalog(tmp_path, nb)
    zh, problems = i18n.translate(nb, polib.pofile(str(po_path)), "zh_CN", po_path)
    assert problems == []
    assert 'print(f"rank {rank}：{steps} 步之后损失为 {loss:.3f}")' in zh.cells[3].source
    lab = notebooks.make_lab(zh, "a", i18n._STUBS["zh_CN"])
    assert '"""实验 99，练习 99.1：一个小程序。"""' in lab.cells[1].source
    assert '    """在每个 rank 上返回 x 的两倍。"""\n    # YOUR CODE HERE（' in lab.cells[1].source
    assert "raise NotImplementedError()" in lab.cells[1].source


def test_an_edited_string_turns_fuzzy_against_its_closest_old_one(tmp_path):
    """An edited print keeps its translation, fuzzy, the old English as previous
    msgid; until confirmed, the cell prints the English."""
    nb = _english()
    po_path = _catalog(tmp_path, nb)
    nb.cells[3].source = nb.cells[3].source.replace("after {steps} steps",
                                                    "after {steps} training steps")
    i18n.update(po_path, nb, "zh_CN", "a")
    po = polib.pofile(str(po_path))
    entry = po.find("rank {rank}: loss {loss:.3f} after {steps} training steps",
                    msgctxt="report code")
    assert entry.fuzzy and entry.previous_msgid.endswith("after {steps} steps")
    assert entry.msgstr == ZH["rank {rank}: loss {loss:.3f} after {steps} steps"]
    zh, problems = i18n.translate(nb, po, "zh_CN", po_path)
    assert [p.cell for p in problems] == ["report"] and "fuzzy" in problems[0].what
    assert "training steps" in zh.cells[3].source and "甘特图" in zh.cells[3].source


def test_a_translation_that_loses_a_field_is_refused(tmp_path):
    """A lost {field} would break the code: refused, named, the English kept."""
    nb = _english()
    po_path = _catalog(tmp_path, nb)
    po = polib.pofile(str(po_path))
    po.find("rank {rank}: loss {loss:.3f} after {steps} steps",
            msgctxt="report code").msgstr = "rank {rank}：损失 {loss}"
    zh, problems = i18n.translate(nb, po, "zh_CN", po_path)
    (problem,) = problems
    assert problem.cell == "report" and "changed its fields" in problem.what
    english_line = 'print(f"rank {rank}: loss {loss:.3f} after {steps} steps")'
    assert english_line in zh.cells[3].source


def test_a_diagram_changes_its_words_and_keeps_its_shape(tmp_path):
    """A ```text block may be translated, its lines and drawing characters kept; a
    code block may not change at all."""
    kept = "两个 rank：\n\n```text\nrank 0 ──发送──▶ rank 1\n  [前向]   [反向]\n```"
    broken = "两个 rank：\n\n```text\nrank 0 ──发送── rank 1\n  [前向]   [反向]\n```"
    assert i18n.fidelity_problem(DIAGRAM, kept) is None
    assert "diagram" in i18n.fidelity_problem(DIAGRAM, broken)
    python = "Run:\n\n```python\nprint('hi')\n```"
    assert "code block" in i18n.fidelity_problem(python, python.replace("hi", "你好"))
    nb = _english()
    po_path = _catalog(tmp_path, nb, diagram=kept)
    zh, problems = i18n.translate(nb, polib.pofile(str(po_path)), "zh_CN", po_path)
    assert problems == [] and zh.cells[4].source == kept
