"""Translated editions of the labs, from gettext catalogs that cannot drift.

Taught in: nowhere (course tooling; locale/README.md is the translator's guide). The
English ``solutions/`` stay the only source. Each translated notebook has a catalog,
``locale/<lang>/LC_MESSAGES/<notebook>.po`` (the layout Poedit and Weblate expect):
one entry per markdown cell, ``msgctxt`` the cell id, ``msgid`` the English text. A
lab is part of an edition when its catalog exists (``labkit i18n init``).

- ``update`` merges the English into a catalog as msgmerge does: a changed cell's
  entry turns fuzzy and keeps its previous ``msgid``; a deleted cell's goes obsolete.
- ``labkit build-labs`` calls ``build_translations``: ``solutions/<lang>/`` gets the
  English notebook with its markdown from the catalog (code cells unchanged), and
  ``labs/<lang>/`` the learner version made from it. A cell whose entry is missing,
  fuzzy, untranslated or older than its English keeps the English text, and that
  entry is a ``Problem`` (``build-labs --check`` fails on it).
- The header's ``**Time:**`` sentence is computed from the English notebook: its
  entry holds ``{{labkit.time}}`` in its place, filled in the catalog's language.
- ``language()`` is the language labkit speaks at run time: ``$LABKIT_LANG``, else
  the notebook's folder (``labs/zh_CN/``), else English.
"""

import dataclasses
import re
import sys
from pathlib import Path

import nbformat

from coursetools import times
from coursetools.notebooks import make_lab, refresh, render
from labkit.messages import language   # noqa: F401  (re-exported: coursetools.i18n.language)

__all__ = ["TIME_TOKEN", "Problem", "catalogs", "update", "translate", "fidelity_problem",
           "build_translations", "status", "language"]

LOCALE = "locale"                  # next to solutions/
RUNTIME_DOMAIN = "labkit"          # reserved: labkit's own messages, not a notebook
GUIDE_DOMAIN = "INSTRUCTORS"       # reserved: INSTRUCTORS.md (coursetools.guides)
TIME_TOKEN = "{{labkit.time}}"
REFRESH = "`labkit i18n update`"
_LANG = re.compile(r"^[a-z]{2,3}_[A-Z]{2}$")
_TIME_NOTE = (f"Keep {TIME_TOKEN}: labkit build-labs puts the Time sentence there, "
              "computed from the English notebook.")
# The Time sentence per language (times.time_sentence's parts, same numbers).
_TIME_TEXT = {"zh_CN": {
    "sentence": "**时间：** {total}：{parts}。{honesty}",
    "join": "，",
    "estimate": "约 {n} 分钟（估计）", "estimate_plus": "约 {n} 分钟，另加计算时间",
    "reading": "阅读 {n} 分钟（英文原文 {words} 词，按每分钟 {wpm} 词计）",
    "code": "读给定代码 {n} 分钟（{what}）", "code_join": "；",
    "modules": "模块 {lines} 行，按每分钟 {rate} 行计",
    "cells": "单元格中 {lines} 行，按每分钟 {rate} 行计",
    "predict": "预测 {n} 分钟（{count} 个问题，每个 {each} 分钟）",
    "exercises": "练习 {n} 分钟（各练习标题中的估计）",
    "measured": "计算 {n} 分钟（完整模式，{date} 在 {on} 上测得{shared}{quick}）",
    "shared": "，当时机器与其他任务共用，负载 {load:.0f}",
    "quick": "；快速模式 {q:.0f} 秒",
    "unmeasured": "计算时间尚未测量（`labkit measure-labs`）",
    "honesty": "词数、行数和计算时间是测量的；速率和练习时间是估计。",
    "room": "**时间：** 约 {n} 分钟，在一个课堂里测得：{learners} 位学员"
            "从准备单元格到最后一个检查所用时间的中位数（{low}–{high} 分钟，"
            "{date}）；模型原来的估计是 {estimate} 分钟。",
    "appendix": "附录另有约 {n} 分钟的阅读，供自学。"}}


@dataclasses.dataclass(frozen=True)
class Problem:
    """A catalog entry that keeps a translated notebook from matching its English."""
    catalog: Path
    notebook: str
    cell: str
    what: str

    def __str__(self) -> str:
        where = (f"{self.notebook} cell {self.cell}" if self.notebook.endswith(".ipynb")
                 else f"{self.notebook}: {self.cell}")
        return (f"{self.catalog}: {where}: {self.what}. "
                f"Refresh the catalogs ({REFRESH}), translate or confirm the entry "
                "(Poedit), then `labkit build-labs` (locale/README.md).")

    __repr__ = __str__


def catalogs(locale_dir) -> list[tuple[str, str, Path]]:
    """Return (language, notebook stem, path) of every notebook catalog."""
    paths = sorted(Path(locale_dir).glob("*/LC_MESSAGES/*.po"))
    return [(p.parent.parent.name, p.stem, p) for p in paths
            if _LANG.match(p.parent.parent.name)
            and p.stem not in (RUNTIME_DOMAIN, GUIDE_DOMAIN)]


def _msgids(english) -> list[tuple[str, str, str]]:
    """Return (cell id, msgid, translator's note) for each markdown cell."""
    nb = nbformat.from_dict(english)
    sentence = times.time_sentence(nb) if times.apply_header(nb) else None
    wanted = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown" or not cell.source.strip():
            continue
        text, note = cell.source, ""
        if index == 0 and sentence and sentence in text:
            text, note = text.replace(sentence, TIME_TOKEN, 1), _TIME_NOTE
        wanted.append((cell.get("id", f"cell-{index}"), text, note))
    return wanted


def _new_catalog(lang: str, name: str):
    import polib

    po = polib.POFile()
    po.header = (f"{lang} translation of solutions/{name}.ipynb (one entry per "
                 "markdown cell, msgctxt = cell id).\nRefresh with `labkit i18n "
                 "update`; see locale/README.md.")
    po.metadata = {"Project-Id-Version": f"multi-gpu-course {name}",
                   "Language": lang, "MIME-Version": "1.0",
                   "Content-Type": "text/plain; charset=UTF-8",
                   "Content-Transfer-Encoding": "8bit",
                   "Plural-Forms": "nplurals=1; plural=0;"}
    return po


def _fuzzy(entry, on: bool) -> None:
    entry.flags = [f for f in entry.flags if f != "fuzzy"] + (["fuzzy"] if on else [])


def _merge(entry, msgid: str) -> None:
    """Give an entry its cell's current English, as msgmerge would."""
    entry.obsolete = False
    if entry.msgid != msgid:
        if entry.msgstr:
            if not entry.fuzzy or not entry.previous_msgid:
                entry.previous_msgid = entry.msgid    # the text the translation is of
            _fuzzy(entry, True)
        entry.msgid = msgid
    if entry.fuzzy and entry.previous_msgid == msgid:
        _fuzzy(entry, False)                          # the English came back to it
    if not entry.fuzzy:
        entry.previous_msgid = None


def update(po_path, english, lang: str, name: str) -> dict:
    """Merge a notebook's English into its catalog (created if missing); return counts.

    A changed cell's translated entry turns fuzzy and keeps the text it translated as
    its previous msgid (when the English returns to that text, the flag goes); a new
    cell gets an untranslated entry; a deleted cell's translated entry goes obsolete.
    """
    import polib

    po_path = Path(po_path)
    po = polib.pofile(str(po_path)) if po_path.exists() else _new_catalog(lang, name)
    by_cell = {entry.msgctxt: entry for entry in po}
    entries, new = [], 0
    for cell, msgid, note in _msgids(english):
        entry = by_cell.pop(cell, None)
        if entry is None:
            entry, new = polib.POEntry(msgctxt=cell, msgid=msgid, msgstr=""), new + 1
        _merge(entry, msgid)
        entry.comment = note
        entries.append(entry)
    return _save_merged(po, po_path, entries, by_cell.values(), new)


def _save_merged(po, po_path: Path, entries: list, gone, new: int) -> dict:
    """Write ``po`` with its live ``entries`` and, obsolete, the translated ones of
    ``gone`` (no longer in the source, kept for reuse), only when the text changed;
    return the counts ``update`` and ``update_runtime`` report."""
    live = len(entries)
    entries = entries + [entry for entry in gone if entry.msgstr]
    for entry in entries[live:]:
        entry.obsolete = True
    po[:] = entries
    text = str(po)
    if not po_path.exists() or po_path.read_text(encoding="utf-8") != text:
        po_path.parent.mkdir(parents=True, exist_ok=True)
        po_path.write_text(text, encoding="utf-8")
    return {"entries": live, "new": new, "fuzzy": sum(e.fuzzy for e in entries[:live]),
            "untranslated": sum(not e.msgstr.strip() for e in entries[:live]),
            "obsolete": len(entries) - live}


def time_sentence(nb, lang: str) -> str:
    """Return the header's Time sentence in ``lang``: the English one's numbers, in
    that language's words (English where there are none yet)."""
    return times.time_sentence(nb, _TIME_TEXT.get(lang, times.TEXT))


def _entry_problem(entry, msgid: str) -> str | None:
    """Say why an entry cannot stand for its English cell; None when it can."""
    if entry is None:
        return "no entry in the catalog (a new cell)"
    if entry.msgid != msgid:
        return "its English changed since the catalog was refreshed"
    if entry.fuzzy:
        return "the entry is fuzzy: its English changed"
    if not entry.msgstr.strip():
        return "the entry is untranslated"
    if TIME_TOKEN in msgid and TIME_TOKEN not in entry.msgstr:
        return f"the translation lost {TIME_TOKEN} (the Time sentence goes there)"
    return fidelity_problem(msgid, entry.msgstr)


# What a translation keeps verbatim: code blocks, code spans, formulas, link and image
# targets, and the number of headings (the book's table of contents and the lab's
# section numbers come from them). Code and API names stay English (TERMINOLOGY.md).
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)   # a span may wrap lines
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.S)
_TARGET = re.compile(r"\]\(([^)\s]+)")
_HEADING = re.compile(r"^#{1,6} ", re.M)
_WORDS = re.compile(r"\\text\{[^}]*\}")   # a formula's words may be translated


def _kept_parts(text: str) -> dict:
    fences = _FENCE.findall(text)
    prose = _FENCE.sub("", text)
    return {"code block": fences, "code span": [" ".join(m.group(2).split())   # rewrapped: same span
                                        for m in _SPAN.finditer(prose)],
            "formula": [_WORDS.sub(r"\\text{}", f) for f in _MATH.findall(_SPAN.sub("", prose))],
            "link target": _TARGET.findall(prose)}


def fidelity_problem(msgid: str, msgstr: str) -> str | None:
    """Say what of the English a translation lost (None when it kept everything):
    each code block, code span, formula and link target of ``msgid`` must appear in
    ``msgstr``, and both must have the same number of headings."""
    english, translated = _kept_parts(msgid), _kept_parts(msgstr)
    for kind, parts in english.items():
        missing = [part for part in dict.fromkeys(parts) if part not in translated[kind]]
        if missing:
            return f"the translation lost the {kind} {missing[0]!r}"
    headings = len(_HEADING.findall(_FENCE.sub("", msgid)))
    if len(_HEADING.findall(_FENCE.sub("", msgstr))) != headings:
        return f"the translation must keep the English's {headings} heading(s)"
    return None


def translate(english, po, lang: str, po_path) -> tuple:
    """Return (translated notebook, problems): markdown from ``po``, the rest as is."""
    nb = nbformat.from_dict(english)
    name = f"{Path(po_path).stem}.ipynb"
    entries = {e.msgctxt: e for e in po if not e.obsolete}
    msgids = {cell: msgid for cell, msgid, _ in _msgids(english)}
    problems = []
    for index, cell in enumerate(nb.cells):
        key = cell.get("id", f"cell-{index}")
        if key not in msgids:
            continue
        entry = entries.pop(key, None)
        why = _entry_problem(entry, msgids[key])
        if why:
            problems.append(Problem(Path(po_path), name, key, why))
        else:
            cell.source = entry.msgstr.replace(TIME_TOKEN, time_sentence(english, lang))
    problems += [Problem(Path(po_path), name, key, "its cell no longer exists")
                 for key in entries]
    nb.metadata.setdefault("labkit", {})["lang"] = lang
    return nb, problems


def _orphans(solutions_dir: Path, labs_dir: Path, wanted: set) -> list[Path]:
    """Return translated notebooks that no catalog makes any more."""
    return [path for base in (solutions_dir, labs_dir)
            for folder in sorted(base.glob("*")) if _LANG.match(folder.name)
            for path in sorted(folder.glob("*.ipynb")) if path not in wanted]


def build_translations(english: dict, solutions_dir, labs_dir, check: bool) -> list:
    """Write every translated solution and lab; return the stale files and problems.

    ``english`` maps each solution's file name to its notebook, as build-labs made it.
    The problems are returned only when checking; otherwise they go to stderr (the
    notebooks are still written, English text in the cells they concern).
    """
    import polib

    solutions_dir, labs_dir = Path(solutions_dir), Path(labs_dir)
    changed, problems, wanted = [], [], set()
    for lang, stem, po_path in catalogs(solutions_dir.parent / LOCALE):
        name = f"{stem}.ipynb"
        if name not in english:
            problems.append(Problem(po_path, name, "-", f"no solutions/{name} to "
                                    "translate (delete the catalog, or restore it)"))
            continue
        try:
            po = polib.pofile(str(po_path))
        except (OSError, ValueError) as err:
            problems.append(Problem(po_path, name, "-", f"cannot be read: {err}"))
            wanted |= {solutions_dir / lang / name, labs_dir / lang / name}
            continue
        solution, found = translate(english[name], po, lang, po_path)
        problems += found
        lab = make_lab(solution, f"{lang}/{name}")
        for target, notebook in ((solutions_dir / lang / name, solution),
                                 (labs_dir / lang / name, lab)):
            wanted.add(target)
            refresh(target, render(notebook), check, changed)
    for orphan in _orphans(solutions_dir, labs_dir, wanted):
        changed.append(orphan)
        if not check:
            orphan.unlink()
    problems += _runtime_catalog_problems(solutions_dir.parent / LOCALE)
    if check:
        return changed + problems
    for problem in problems:
        print(f"labkit build-labs: English text kept: {problem}", file=sys.stderr)
    return changed


def status(locale_dir) -> list[dict]:
    """Count each catalog's entries: translated, fuzzy, untranslated, obsolete."""
    import polib

    rows = []
    for lang, stem, path in catalogs(locale_dir):
        po = polib.pofile(str(path))
        live = [e for e in po if not e.obsolete]
        fuzzy = sum(e.fuzzy for e in live)
        translated = sum(bool(e.msgstr.strip()) and not e.fuzzy for e in live)
        rows.append({"catalog": path, "lang": lang, "notebook": stem,
                     "entries": len(live), "translated": translated, "fuzzy": fuzzy,
                     "untranslated": len(live) - translated - fuzzy,
                     "obsolete": len(po) - len(live)})
    return rows


# labkit's own messages (labkit/messages.py): one catalog per language, keyed by the
# English template itself (no msgctxt), refreshed from the sources by Babel's extractor.

def update_runtime(lang: str, po_path=None) -> dict:
    """Merge labkit's marked messages into the ``lang`` catalog; return counts.

    A new message gets an untranslated entry; a message no longer in the sources goes
    obsolete (kept for reuse); each entry names the files that use it.
    """
    import polib

    from labkit import messages

    po_path = Path(po_path or messages.catalog_path(lang))
    if po_path.exists():
        po = polib.pofile(str(po_path))
    else:
        po = _new_catalog(lang, "labkit")
        po.header = (f"{lang} translation of labkit's messages (labkit/messages.py). "
                     "Refresh with `labkit i18n update`; see locale/README.md.")
        po.metadata["Project-Id-Version"] = "multi-gpu-course labkit"
    where: dict[str, list[str]] = {}
    for message, filename, _line in messages_in_sources():
        files = where.setdefault(message, [])
        if filename not in files:
            files.append(filename)
    by_id = {entry.msgid: entry for entry in po}
    entries, new = [], 0
    for message, files in where.items():
        entry = by_id.pop(message, None)
        if entry is None:
            entry, new = polib.POEntry(msgid=message, msgstr=""), new + 1
        entry.obsolete = False
        entry.occurrences = [(f"labkit/{name}", "") for name in sorted(files)]
        entry.flags = ["python-brace-format"] + [f for f in entry.flags
                                                 if f == "fuzzy"]
        entries.append(entry)
    return _save_merged(po, po_path, entries, by_id.values(), new)


def runtime_problems(lang: str, po_path=None) -> list[Problem]:
    """Say which of labkit's messages the ``lang`` catalog does not translate."""
    import polib

    from labkit import messages

    po_path = Path(po_path or messages.catalog_path(lang))
    if not po_path.exists():
        return [Problem(po_path, "labkit's messages", "-", "no catalog (`labkit i18n "
                        "update` creates it)")]
    entries = {e.msgid: e for e in polib.pofile(str(po_path)) if not e.obsolete}
    problems = []
    for message in dict.fromkeys(m for m, _f, _l in messages_in_sources()):
        entry = entries.get(message)
        why = ("no entry (a new message)" if entry is None else
               "the entry is fuzzy" if entry.fuzzy else
               "the entry is untranslated" if not entry.msgstr.strip() else
               _fields_problem(message, entry.msgstr))
        if why:
            problems.append(Problem(po_path, "labkit's messages", repr(message[:60]), why))
    return problems


def _runtime_catalog_problems(locale_dir: Path) -> list[Problem]:
    """The runtime catalogs' problems, for each language of the edition: required in
    the checkout's own locale/ (the one labkit speaks from), checked where present."""
    from labkit import messages

    problems = []
    for lang in sorted({lang for lang, _stem, _path in catalogs(locale_dir)}):
        path = runtime_catalog(locale_dir, lang)
        if path == messages.catalog_path(lang) or path.exists():
            problems += runtime_problems(lang, path)
    return problems


def runtime_catalog(locale_dir, lang: str) -> Path:
    """Where the catalog of labkit's messages for an edition lives: in the package
    (labkit/locale/) for the course's own locale/, else beside the notebooks' catalogs
    (a copy of the course, as the tests make)."""
    from labkit import messages

    if Path(locale_dir).resolve() == messages.CATALOGS.parents[1] / LOCALE:
        return messages.catalog_path(lang)
    return Path(locale_dir) / lang / "LC_MESSAGES" / f"{RUNTIME_DOMAIN}.po"


_FIELD = re.compile(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)[^{}]*\}")


def _fields_problem(english: str, translated: str) -> str | None:
    """A translated template must use the English one's {fields}, no others."""
    want, got = set(_FIELD.findall(english)), set(_FIELD.findall(translated))
    if want != got:
        return (f"the translation's fields {sorted(got)} differ from the English's "
                f"{sorted(want)}")
    return None


def messages_in_sources(package_dir=None) -> list[tuple[str, str, int]]:
    """Return (template, file, line) of every ``_("...")`` in labkit's sources."""
    from babel.messages.extract import extract_from_dir

    from labkit import messages

    package_dir = Path(package_dir or messages.CATALOGS.parent)
    found = extract_from_dir(str(package_dir), method_map=[("**.py", "python")],
                             keywords={"_": None, "N_": None}, comment_tags=(),
                             strip_comment_tags=True)
    return [(message, filename, lineno)
            for filename, lineno, message, _comments, _context in found
            if isinstance(message, str)]
