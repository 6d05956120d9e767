"""Tests for coursetools.i18n: catalogs from the English notebooks, translated notebooks
from the catalogs, and the drift check (labkit build-labs --check)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import polib
import pytest

from labkit import cli, messages
from coursetools import build, notebooks
from coursetools import i18n, times as lab_time

ROOT = Path(__file__).resolve().parents[2]
LOCALE = ROOT / "locale"
CATALOGS = i18n.catalogs(LOCALE)
HEADER = ("# Lab 99 — Tiny\n\nWhy it matters.\n\n**Time:** unknown yet. "
          "**Hardware:** CPU-only is fine.")


def _notebook(*markdown: str) -> nbformat.NotebookNode:
    """A solution: a header, the given markdown cells, an exercise and its check."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(HEADER, id="h")]
    nb.cells += [nbformat.v4.new_markdown_cell(text, id=f"m{i}")
                 for i, text in enumerate(markdown)]
    nb.cells += [nbformat.v4.new_code_cell(
        f"def f():\n    {notebooks.BEGIN}\n    return 1\n    {notebooks.END}", id="ex"),
        nbformat.v4.new_code_cell("checks.f(f)", id="check")]
    nb.metadata["labkit"] = {"min_gpus": 0, "cpu_ok": True, "world_size": 1}
    lab_time.apply_header(nb)
    return nb


def _translate_all(po_path: Path, prefix: str = "中文 ") -> None:
    po = polib.pofile(str(po_path))
    for entry in po:   # a heading stays a heading: "# 中文 Lab 99 ..."
        heading = re.match(r"#+ ", entry.msgid)
        cut = heading.end() if heading else 0
        entry.msgstr = entry.msgid[:cut] + prefix + entry.msgid[cut:]
        entry.flags = [f for f in entry.flags if f != "fuzzy"]
        entry.previous_msgid = None
    po.save()


def _tree(tmp_path: Path, nb) -> Path:
    """A course tree with solutions/a.ipynb and a translated zh_CN catalog for it."""
    (tmp_path / "solutions").mkdir()
    nbformat.write(nb, tmp_path / "solutions" / "a.ipynb")
    po_path = tmp_path / "locale" / "zh_CN" / "LC_MESSAGES" / "a.po"
    i18n.update(po_path, nb, "zh_CN", "a")
    _translate_all(po_path)
    return po_path


def test_update_makes_one_entry_per_markdown_cell(tmp_path):
    """Is each markdown cell one entry, msgctxt its id, msgid its English?"""
    nb = _notebook("First text.", "Second text.")
    counts = i18n.update(tmp_path / "a.po", nb, "zh_CN", "a")
    po = polib.pofile(str(tmp_path / "a.po"))
    assert counts == {"entries": 3, "new": 3, "fuzzy": 0, "untranslated": 3,
                      "obsolete": 0}
    assert [(e.msgctxt, e.msgid) for e in po][1:] == [("m0", "First text."),
                                                    ("m1", "Second text.")]
    assert po.metadata["Language"] == "zh_CN"


def test_header_entry_holds_the_time_token_not_the_numbers(tmp_path):
    """Does the header's entry survive a change of word count elsewhere?"""
    i18n.update(tmp_path / "a.po", _notebook("Short."), "zh_CN", "a")
    first = polib.pofile(str(tmp_path / "a.po"))[0]
    assert i18n.TIME_TOKEN + " **Hardware:**" in first.msgid
    assert "**Time:**" not in first.msgid
    assert first.comment.startswith(f"Keep {i18n.TIME_TOKEN}")
    i18n.update(tmp_path / "a.po", _notebook("Much longer now " * 300), "zh_CN", "a")
    again = polib.pofile(str(tmp_path / "a.po"))
    assert again[0].msgid == first.msgid and not again[0].fuzzy
    assert again[1].msgstr == ""   # untranslated: its English just changed, no flag


def test_catalog_round_trip(tmp_path):
    """Does a translated catalog give the notebook back with only its markdown changed,
    and does updating it again leave the file byte for byte as it was?"""
    nb = _notebook("Text with `code` and $x^2$.")
    po_path = tmp_path / "a.po"
    i18n.update(po_path, nb, "zh_CN", "a")
    _translate_all(po_path)
    before = po_path.read_bytes()
    assert i18n.update(po_path, nb, "zh_CN", "a")["untranslated"] == 0
    assert po_path.read_bytes() == before
    zh, problems = i18n.translate(nb, polib.pofile(str(po_path)), "zh_CN", po_path)
    assert problems == []
    assert zh.cells[1].source == "中文 Text with `code` and $x^2$."
    assert zh.cells[0].source.startswith("# 中文 Lab 99")
    assert i18n.time_sentence(nb, "zh_CN", zh) in zh.cells[0].source
    assert [c.source for c in zh.cells[2:]] == [c.source for c in nb.cells[2:]]
    assert [c.id for c in zh.cells] == [c.id for c in nb.cells]
    assert zh.metadata["labkit"]["lang"] == "zh_CN" and "lang" not in nb.metadata.labkit


def test_changed_cell_turns_fuzzy_keeping_its_previous_msgid(tmp_path):
    """Does an English edit mark just that entry fuzzy, its old English kept, and
    does undoing the edit clear the flag?"""
    nb = _notebook("One.", "Two.")
    po_path = tmp_path / "a.po"
    i18n.update(po_path, nb, "zh_CN", "a")
    _translate_all(po_path)
    nb.cells[2].source = "Two, edited."
    assert i18n.update(po_path, nb, "zh_CN", "a")["fuzzy"] == 1
    po = polib.pofile(str(po_path))
    assert [e.msgctxt for e in po if e.fuzzy] == ["m1"]
    assert po[2].previous_msgid == "Two." and po[2].msgid == "Two, edited."
    assert po[2].msgstr == "中文 Two."
    nb.cells[2].source = "Two, edited twice."
    i18n.update(po_path, nb, "zh_CN", "a")
    assert polib.pofile(str(po_path))[2].previous_msgid == "Two."   # what it translates
    nb.cells[2].source = "Two."
    i18n.update(po_path, nb, "zh_CN", "a")
    entry = polib.pofile(str(po_path))[2]
    assert not entry.fuzzy and entry.previous_msgid is None


def test_new_and_deleted_cells(tmp_path):
    """Does a new cell get an untranslated entry and a deleted one go obsolete?"""
    nb = _notebook("One.", "Two.")
    po_path = tmp_path / "a.po"
    i18n.update(po_path, nb, "zh_CN", "a")
    _translate_all(po_path)
    del nb.cells[1]
    nb.cells.insert(1, nbformat.v4.new_markdown_cell("New.", id="new"))
    counts = i18n.update(po_path, nb, "zh_CN", "a")
    assert (counts["new"], counts["obsolete"], counts["untranslated"]) == (1, 1, 1)
    po = polib.pofile(str(po_path))
    assert [e.msgctxt for e in po.obsolete_entries()] == ["m0"]
    _, problems = i18n.translate(nb, po, "zh_CN", po_path)
    assert [(p.cell, p.what) for p in problems] == [("new",
                                                     "the entry is untranslated")]


@pytest.mark.parametrize("spoil, what", [
    (lambda e: setattr(e, "msgstr", ""), "the entry is untranslated"),
    (lambda e: e.flags.append("fuzzy"), "the entry is fuzzy: its English changed"),
    (lambda e: setattr(e, "msgid", "Old English."),
     "its English changed since the catalog was refreshed"),
])
def test_each_kind_of_drift_is_a_problem(tmp_path, spoil, what):
    """Is a missing, fuzzy or out-of-date entry named, its cell kept in English?"""
    nb = _notebook("One.", "Two.")
    po_path = tmp_path / "a.po"
    i18n.update(po_path, nb, "zh_CN", "a")
    _translate_all(po_path)
    po = polib.pofile(str(po_path))
    spoil(po[2])
    zh, problems = i18n.translate(nb, po, "zh_CN", po_path)
    assert [(p.notebook, p.cell, p.what) for p in problems] == [("a.ipynb", "m1", what)]
    assert zh.cells[2].source == "Two." and zh.cells[1].source == "中文 One."


def test_lost_time_token_is_a_problem(tmp_path):
    """Does a header translation without {{labkit.time}} fail, naming the token?"""
    nb = _notebook("One.")
    po_path = tmp_path / "a.po"
    i18n.update(po_path, nb, "zh_CN", "a")
    _translate_all(po_path)
    po = polib.pofile(str(po_path))
    po[0].msgstr = po[0].msgstr.replace(i18n.TIME_TOKEN, "")
    _, problems = i18n.translate(nb, po, "zh_CN", po_path)
    assert [p.cell for p in problems] == ["h"] and i18n.TIME_TOKEN in problems[0].what


def test_time_sentence_reads_the_chinese_text():
    """Does the Chinese Time sentence count its reading on the Chinese text (字 at the
    stated rate, the appendix apart), keep the English exercises and compute, and
    name the machine in Chinese?"""
    from coursetools import edition_time

    nb = _notebook("word " * 450, "## Appendix\n\n" + "more " * 250)
    nb.cells[1].source += "\n\n### Exercise 1.1 — x (≈ 7 min)"
    zh = nbformat.from_dict(nb)
    zh.cells[0].source = "# 实验 99"                                     # 3 字
    zh.cells[1].source = "读" * 1190 + " all-reduce 4096 GiB\n\n### 练习 1.1（≈ 7 分钟）"
    zh.cells[2].source = "## 附录\n\n" + "附" * 448                     # 450 字
    rate = edition_time.CHARACTERS_PER_MINUTE["zh_CN"]
    assert edition_time.characters(zh.cells[1].source) == 1190 + 3 + 2 + 2 + 2
    core = 3 + 1199
    for measured in (None, {"full_mode_s": 125.0, "quick_mode_s": 33.0,
                            "on": "2 CPU cores", "date": "2026-12-01", "load": 1.0,
                            "cores": 2}):
        if measured:
            nb.metadata["labkit"]["measured"] = measured
        parts = lab_time.minutes(nb)
        chinese = i18n.time_sentence(nb, "zh_CN", zh)
        reading = -(-core // rate)
        assert f"阅读 {reading} 分钟（中文 {core:,} 字，按每分钟 {rate} 字计）" in chinese
        assert f"练习 {parts['exercises']} 分钟" in chinese
        assert f"附录另有约 {-(-450 // rate)} 分钟" in chinese
        if measured:
            assert f"计算 {parts['compute']} 分钟" in chinese
            assert f"约 {reading + parts['exercises'] + parts['compute']} 分钟" in chinese
            assert "在 2 个 CPU 核上测得" in chinese and "CPU cores" not in chinese
        assert "min" not in chinese.replace("measure-labs", "")
    assert edition_time.machine("1 × NVIDIA H200", "zh_CN") == "1 块 NVIDIA H200 "


def test_build_labs_writes_translated_solution_and_lab(tmp_path):
    """Does build-labs write solutions/zh_CN and labs/zh_CN, the lab stubbed from the
    Chinese solution, and then report them fresh?"""
    _tree(tmp_path, _notebook("One."))
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    changed = build.build_labs(solutions, labs)
    assert {solutions / "zh_CN" / "a.ipynb", labs / "zh_CN" / "a.ipynb"} <= set(changed)
    zh_solution = nbformat.read(solutions / "zh_CN" / "a.ipynb", as_version=4)
    zh_lab = nbformat.read(labs / "zh_CN" / "a.ipynb", as_version=4)
    english = nbformat.read(solutions / "a.ipynb", as_version=4)
    assert zh_solution.cells[1].source == "中文 One."
    assert zh_solution.cells[2].source == english.cells[2].source
    assert zh_lab.cells[2].source == ("def f():\n    # YOUR CODE HERE（在这里写你的代码）"
                                      "\n    raise NotImplementedError()")
    assert zh_lab.cells[1].source == "中文 One."
    assert zh_lab.metadata["labkit"]["lang"] == "zh_CN"
    assert build.build_labs(solutions, labs, check=True) == []


def test_stale_and_orphan_translations_are_reported(tmp_path):
    """Is a hand-edited Chinese notebook stale, and one without a catalog removed?"""
    po_path = _tree(tmp_path, _notebook("One."))
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    build.build_labs(solutions, labs)
    target = labs / "zh_CN" / "a.ipynb"
    target.write_text(target.read_text().replace("中文 One.", "edited by hand"))
    assert build.build_labs(solutions, labs, check=True) == [target]
    po_path.unlink()
    stale = build.build_labs(solutions, labs, check=True)
    assert stale == [solutions / "zh_CN" / "a.ipynb", target]
    build.build_labs(solutions, labs)
    assert not target.exists() and not (solutions / "zh_CN" / "a.ipynb").exists()


def test_unreadable_catalog_is_a_problem_not_a_crash(tmp_path, capsys):
    """Does a broken .po give a named problem while build-labs writes the rest?"""
    po_path = _tree(tmp_path, _notebook("One."))
    po_path.write_text('msgctxt "m0"\nmsgid "One."\nmsgstr "一。"\ngarbage\n')
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    assert labs / "a.ipynb" in build.build_labs(solutions, labs)
    assert "cannot be read" in capsys.readouterr().err
    problems = build.build_labs(solutions, labs, check=True)
    assert [type(p) for p in problems] == [i18n.Problem]


@pytest.fixture
def course_copy(tmp_path) -> Path:
    """The translated English solutions and their catalogs, copied and built."""
    if not CATALOGS:
        pytest.skip("no catalog in locale/")
    (tmp_path / "solutions").mkdir()
    for _, stem, _ in CATALOGS:
        shutil.copy(ROOT / "solutions" / f"{stem}.ipynb", tmp_path / "solutions")
    shutil.copytree(LOCALE, tmp_path / "locale")
    for lang in {lang for lang, _stem, _path in CATALOGS}:   # labkit's, from the package
        shutil.copy(messages.catalog_path(lang), i18n.runtime_catalog(tmp_path / "locale",
                                                                      lang))
    build.build_labs(tmp_path / "solutions", tmp_path / "labs")
    return tmp_path


def test_check_fails_on_exactly_the_edited_english_cell(course_copy, capsys):
    """Does one edited English cell fail the check on that entry alone, before and
    after the catalogs are refreshed, naming the notebook, the cell and the command,
    and pass again once the entry is translated?"""
    solutions, labs = course_copy / "solutions", course_copy / "labs"
    assert build.build_labs(solutions, labs, check=True) == []
    _, stem, po_path = CATALOGS[0]
    path = solutions / f"{stem}.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells[1:] if c.cell_type == "markdown")
    cell.source += "\n\nOne more sentence."
    nbformat.write(nb, path)
    build.build_labs(solutions, labs)   # as others run it: it writes what it can
    assert "English text kept" in capsys.readouterr().err
    for refreshed in (False, True):
        problems = build.build_labs(solutions, labs, check=True)
        assert [(p.notebook, p.cell) for p in problems] == [(path.name, cell.id)]
        message = str(problems[0])
        assert path.name in message and "`labkit i18n update`" in message
        if not refreshed:
            assert cli.main(["i18n", "update", "--solutions", str(solutions),
                             "--locale", str(course_copy / "locale")]) == 0
    assert "fuzzy" in problems[0].what
    zh = nbformat.read(solutions / "zh_CN" / path.name, as_version=4)
    assert next(c for c in zh.cells if c.id == cell.id).source == cell.source
    po_file = course_copy / po_path.relative_to(ROOT)
    po = polib.pofile(str(po_file))
    entry = next(e for e in po if e.msgctxt == cell.id)
    assert entry.fuzzy
    assert entry.previous_msgid + "\n\nOne more sentence." == entry.msgid
    assert [e.msgctxt for e in po if e.fuzzy] == [cell.id]
    entry.msgstr += "\n\n再加一句。"
    entry.flags.remove("fuzzy")
    entry.previous_msgid = None
    po.save()
    build.build_labs(solutions, labs)
    assert build.build_labs(solutions, labs, check=True) == []


@pytest.mark.parametrize("english, translated, lost", [
    ("Run `torchrun --nproc-per-node=2 x.py` now.", "现在运行 `torchrun x.py`。", "code span"),
    ("```bash\nmake test\n```", "```bash\nmake tests\n```", "code block"),
    ("Bubble $\\frac{p-1}{m+p-1}$.", "气泡 $\\frac{p-1}{m}$。", "formula"),
    ("See [the docs](https://pytorch.org/docs).", "见[文档](https://pytorch.org)。",
     "link target"),
    ("## 1. Setup\n\nText.", "1. 准备\n\n正文。", "heading"),
])
def test_a_translation_that_loses_part_of_its_english_is_a_problem(english, translated,
                                                                    lost):
    """Does the build refuse a translation that dropped a code span, a code block, a
    formula, a link target or a heading of its English?"""
    assert lost in i18n.fidelity_problem(english, translated)


def test_what_a_translation_may_change():
    """Rewrapped code spans and the words of a formula's \\text{} are still faithful."""
    english = ("Run `torchrun --nproc-per-node=2\n  x.py` and read\n"
               "$$\\text{bubble} = \\frac{p-1}{m+p-1}$$\n## 2. Next")
    translated = ("运行 `torchrun --nproc-per-node=2 x.py` 并阅读"
                  "$$\\text{气泡} = \\frac{p-1}{m+p-1}$$\n## 2. 下一节")
    assert i18n.fidelity_problem(english, translated) is None


@pytest.mark.parametrize("catalog", [c[2] for c in CATALOGS],
                         ids=[c[1] for c in CATALOGS])
def test_translations_keep_code_headings_and_math(catalog):
    """Does every translation keep its English code, formulas, links and headings (a
    code span quoting a printed line: as the edition prints it, as build-labs
    allows)?"""
    printed = i18n._printed(LOCALE, catalog.parent.parent.name)
    for entry in polib.pofile(str(catalog)):
        if entry.obsolete or not entry.msgstr:
            continue
        where = f"{catalog.name} {entry.msgctxt}"
        assert i18n.fidelity_problem(entry.msgid, entry.msgstr, printed) is None, where


def test_language_choice():
    """Is the language $LABKIT_LANG, else the notebook's folder, else English?"""
    assert i18n.language({"LABKIT_LANG": "zh_CN.UTF-8"}, cwd="/x/labs") == "zh_CN"
    assert i18n.language({"LABKIT_LANG": "zh-CN"}, cwd="/x") == "zh_CN"
    assert i18n.language({"JPY_SESSION_NAME": "/c/labs/zh_CN/04.ipynb"},
                         cwd="/c") == "zh_CN"
    assert i18n.language({}, cwd="/c/solutions/zh_CN") == "zh_CN"
    assert i18n.language({}, cwd="/c/labs") == "en"
    assert i18n.language({}, cwd="/c/env") == "en"


def test_cli_init_update_status(tmp_path, capsys):
    """Do `labkit i18n init`, `update` and `status` create and count a catalog?"""
    (tmp_path / "solutions").mkdir()
    nbformat.write(_notebook("One."), tmp_path / "solutions" / "07_x.ipynb")
    where = ["--solutions", str(tmp_path / "solutions"), "--locale",
             str(tmp_path / "locale")]
    assert cli.main(["i18n", "init", "07", *where]) == 0
    assert (tmp_path / "locale/zh_CN/LC_MESSAGES/07_x.po").exists()
    assert cli.main(["i18n", "status", *where]) == 0
    assert "2 entries, 0 translated, 0 fuzzy, 2 untranslated" in capsys.readouterr().out
    assert cli.main(["i18n", "init", "nope", *where]) == 2


def test_build_labs_check_prints_problems(tmp_path, capsys, monkeypatch):
    """Does `labkit build-labs --check` print each problem and exit 1?"""
    po_path = _tree(tmp_path, _notebook("One."))
    po = polib.pofile(str(po_path))
    po[1].msgstr = ""
    po.save()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["build-labs", "--check", "--rooms", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    assert ("out of sync: locale/zh_CN/LC_MESSAGES/a.po: a.ipynb cell m0: the entry "
            "is untranslated") in out


def test_pytest_collects_the_translated_solutions():
    """Does make test's pytest command collect solutions/zh_CN/ under nbval, and does
    tests/conftest.py's hardware rule read the same needs there as in the English?"""
    if not CATALOGS:
        pytest.skip("no catalog in locale/")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
         "no:cacheprovider", "--nbval-lax", "--nbval-current-env", "solutions"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    for lang, stem, _ in CATALOGS:
        node = f"solutions/{lang}/{stem}.ipynb::Cell 0"
        assert node in done.stdout, done.stdout[-2000:]
        assert (notebooks.hardware_needs(ROOT / "solutions" / lang / f"{stem}.ipynb")
                == notebooks.hardware_needs(ROOT / "solutions" / f"{stem}.ipynb"))


# ---------------------------------------------------------------- labkit's messages

# Every labkit module a learner meets in a notebook speaks the learner's language: its
# prints, errors, check verdicts and hints, plot words and widget labels go through
# labkit.messages._. What is for instructors and root on the command line speaks
# English: the `labkit` command (cli.py), the benchmarks (`labkit bench`, the rooms'
# bench_*.py) and the cluster in a box's CLI (cluster.py; its notebook cells print
# through the rooms' node modules, which are translated). The course tooling
# (coursetools) is not in labkit at all.
COMMAND_LINE = {"cli.py", "cluster.py", "bench.py"}
SPEAK_THE_LEARNERS_LANGUAGE = sorted(
    str(path.relative_to(ROOT / "labkit")) for path in (ROOT / "labkit").rglob("*.py")
    if path.name not in COMMAND_LINE and not path.name.startswith("bench_"))
_SAYS = {"print", "passed", "ExerciseFailed", "LaunchError", "WorkerError",
         "CollectiveTimeout", "DeadlineExceeded", "ValueError", "TypeError", "KeyError",
         "RuntimeError"}


def _english_literal(node) -> bool:
    """Is this argument English text written in place (a literal, an f-string or a
    sum of them) rather than a template passed through _()?"""
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return any(c.isalpha() for c in node.value)
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.Constant) and any(c.isalpha() for c in v.value)
                   for v in node.values)
    if isinstance(node, ast.BinOp):
        return _english_literal(node.left) or _english_literal(node.right)
    return False


_LABELS = {"set_title", "set_xlabel", "set_ylabel", "suptitle", "title", "xlabel",
           "ylabel"}                              # a plot's words (the first argument)
_LABEL_KEYWORDS = {"description", "title", "label", "placeholder", "tooltip",
                   "xlabel", "ylabel"}            # a widget's or a plot's, by keyword


def untranslatable_messages(path: Path) -> list[str]:
    """Every message in ``path`` a learner reads that is not translatable: the text of
    a print, a raise or a check's verdict, a plot's title and axes, a widget's label."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", getattr(node.func, "attr", None))
        said = [node.args[0]] if name in _SAYS | _LABELS and node.args else []
        said += [k.value for k in node.keywords if k.arg in _LABEL_KEYWORDS]
        found += [f"{path.name}:{node.lineno}: {ast.unparse(text)[:80]}"
                  for text in said if _english_literal(text)]
    return found


def test_the_scan_finds_a_message_not_marked_for_translation(tmp_path):
    """Does the scan flag an f-string given to ExerciseFailed, and pass a template?"""
    module = tmp_path / "m.py"
    module.write_text('raise ExerciseFailed(f"rank {r} failed")\n'
                      'raise ExerciseFailed(_("rank {r} failed").format(r=r))\n'
                      'print(message)\n')
    assert untranslatable_messages(module) == ["m.py:1: f'rank {r} failed'"]


@pytest.mark.parametrize("module", SPEAK_THE_LEARNERS_LANGUAGE)
def test_every_message_of_the_module_is_translatable(module):
    """Does every sentence the module says to the learner go through _()?"""
    assert untranslatable_messages(ROOT / "labkit" / module) == []


def test_every_message_of_labkit_is_translated():
    """Does each language's catalog of labkit's messages translate every marked one,
    with the same {fields}?"""
    langs = sorted({lang for lang, _stem, _path in CATALOGS})
    assert langs, "no translation in locale/"
    for lang in langs:
        assert i18n.runtime_problems(lang) == [], lang


def test_a_changed_message_is_a_problem(tmp_path):
    """A catalog missing a marked message, or whose translation lost a field, fails."""
    po_path = tmp_path / "labkit.po"
    shutil.copy(messages.catalog_path("zh_CN"), po_path)
    po = polib.pofile(str(po_path))
    template = "Backend: {backend} on {device}, {n} rank(s) - {reason}"
    entry = po.find(template)
    entry.msgstr = "后端：{backend}，{n} 个 rank - {reason}"      # lost {device}
    po.remove(po.find("Launching {n} rank(s) of {name} ({backend}, rendezvous on "
                      "127.0.0.1:{port}, loopback only)"))
    po.save()
    problems = [str(p) for p in i18n.runtime_problems("zh_CN", po_path)]
    assert len(problems) == 2, problems
    assert "no entry (a new message)" in problems[0] + problems[1]
    assert "fields" in problems[0] + problems[1]


def test_a_chinese_notebook_hears_chinese(monkeypatch, capsys):
    """In labs/zh_CN/, do begin()'s lines, a check's verdicts and the launcher speak
    Chinese, and stay English elsewhere?"""
    from labkit import checks, mode
    from labkit.checks import _core

    monkeypatch.setenv("LABKIT_LANG", "zh_CN")
    assert mode.describe().startswith("模式：快速")
    _core.passed("Exercise 0.1", "3/3")
    assert capsys.readouterr().out.strip() == "✅ Exercise 0.1：通过。3/3"
    with pytest.raises(checks.ExerciseFailed, match="尚未完成"):
        _core.attempt("Exercise 0.1", _stub)
    from labkit import hardware

    assert "个 rank" in hardware.backend_line(hardware.choose(2, "gloo", verbose=False))
    monkeypatch.setenv("LABKIT_LANG", "en")
    assert mode.describe().startswith("Mode: QUICK")


def _stub():
    raise NotImplementedError()


def test_ranks_speak_the_notebooks_language(monkeypatch):
    """Does a launch from a Chinese notebook give its ranks the language, so an error
    the launcher reports is Chinese?"""
    from labkit import launch

    monkeypatch.setenv("LABKIT_LANG", "zh_CN")
    results = launch.run(_language_of_rank, world_size=2, backend="gloo", timeout=30)
    assert results == ["zh_CN", "zh_CN"]
    with pytest.raises(launch.WorkerError, match="Rank 1 抛出了 ValueError: rank one"):
        launch.run(_language_of_rank, world_size=2, args=(True,), backend="gloo",
                   timeout=30)
    with pytest.raises(ValueError, match="必须是正数"):
        launch.run(_language_of_rank, world_size=2, backend="gloo", timeout=-1)


def _language_of_rank(ctx, fail_on_rank_one=False):
    from labkit.messages import language

    if fail_on_rank_one and ctx.rank == 1:
        raise ValueError("rank one fails")
    return language()


def test_chinese_plots_find_their_glyphs(monkeypatch, tmp_path):
    """In Chinese, does a figure with Chinese words draw every glyph (a CJK font first
    in matplotlib's fallback), where in English the same words would be boxes?"""
    import warnings

    import matplotlib
    import matplotlib.pyplot as plt

    from labkit import timeline

    monkeypatch.setenv("LABKIT_LANG", "zh_CN")
    saved = dict(matplotlib.rcParams)
    try:
        if not timeline.use_cjk_font():
            pytest.skip("no CJK font here (fonts-noto-cjk): tests/test_browser.py "
                        "fails on that in CI")
        fig, ax = plt.subplots()
        ax.set_title("流水线并行的气泡")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig.savefig(tmp_path / "zh.png")
        plt.close(fig)
        assert not [w for w in caught if "missing from" in str(w.message)]
    finally:
        matplotlib.rcParams.update(saved)
