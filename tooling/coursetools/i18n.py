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
- The header's ``**Time:**`` sentence is computed, not translated: its entry holds
  ``{{labkit.time}}`` in its place, filled in the catalog's language by
  ``coursetools.edition_time`` (the reading from the translation's own text, the
  exercises and the compute from the English notebook).
- ``language()`` is the language labkit speaks at run time: ``$LABKIT_LANG``, else
  the notebook's folder (``labs/zh_CN/``), else English.
"""

import dataclasses
import re
import sys
from pathlib import Path

import nbformat

from coursetools import code_strings, edition_time, quoted_outputs, times
from coursetools.edition_time import time_sentence   # noqa: F401  (re-exported)
from coursetools.notebooks import CODE_STUB, TEXT_STUB, make_lab, refresh, render
from labkit.messages import language   # noqa: F401  (re-exported: coursetools.i18n.language)

__all__ = ["TIME_TOKEN", "Problem", "catalogs", "update", "translate", "fidelity_problem",
           "build_translations", "status", "language"]

LOCALE = "locale"                  # next to solutions/
RUNTIME_DOMAIN = "labkit"          # reserved: labkit's own messages, not a notebook
GUIDE_DOMAIN = "INSTRUCTORS"       # reserved: INSTRUCTORS.md (coursetools.guides)
TIME_TOKEN = edition_time.TOKEN
CODE = " code"                     # msgctxt of a code cell's strings: "<cell id> code"
LABELS = "labels" + CODE           # msgctxt of the notebook's declared labels
REFRESH = "`labkit i18n update`"
_LANG = re.compile(r"^[a-z]{2,3}_[A-Z]{2}$")
_TIME_NOTE = (f"Keep {TIME_TOKEN}: labkit build-labs puts the Time sentence there, "
              "its reading computed from this translation, the rest from the English "
              "notebook.")
# The learner edition's stubs per language: nbgrader's English marker kept (what
# graders and nbgrader's docs search for), its meaning added; the same
# NotImplementedError, which the checks read as "not done yet".
_STUBS = {"zh_CN": (["# YOUR CODE HERE（在这里写你的代码）", "raise NotImplementedError()"],
                    ["YOUR ANSWER HERE（在这里写下你的答案）"])}


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


_LABEL_NOTE = ("A label the notebook's code uses as data too (metadata.labkit.labels): "
               "it is translated the same in every code cell where it stands.")
_CODE_NOTE = ("What this code shows the learner (a print, a label, a docstring). Keep "
              "every {field} exactly as it is; the code around it is not translated:")


def _code_note(source: str, literal) -> str:
    """The translator's note of a code string: the line(s) it stands on."""
    first = source.rfind("\n", 0, literal.start) + 1
    last = source.find("\n", literal.end)
    return f"{_CODE_NOTE}\n{source[first:last if last != -1 else len(source)]}"


def _msgids(english) -> list[tuple[str, str, str]]:
    """Return (msgctxt, msgid, translator's note): one per markdown cell (msgctxt: the
    cell id), and one per learner-facing string of a code cell (msgctxt: the cell id
    and " code"; coursetools.code_strings finds them)."""
    nb = nbformat.from_dict(english)
    sentence = times.time_sentence(nb) if times.apply_header(nb) else None
    labels = _labels(nb)
    wanted = [(LABELS, label, _LABEL_NOTE) for label in labels]
    for index, cell in enumerate(nb.cells):
        key = cell.get("id", f"cell-{index}")
        if cell.cell_type == "code":
            seen = set(labels)
            for literal in code_strings.strings(cell.source, labels):
                if literal.text not in seen:
                    seen.add(literal.text)
                    wanted.append((key + CODE, literal.text,
                                   _code_note(cell.source, literal)))
            continue
        if cell.cell_type != "markdown" or not cell.source.strip():
            continue
        text, note = cell.source, ""
        if index == 0 and sentence and sentence in text:
            text, note = text.replace(sentence, TIME_TOKEN, 1), _TIME_NOTE
        wanted.append((key, text, note))
    return wanted


def _labels(nb) -> list[str]:
    """The notebook's declared labels: strings its code uses as data and the learner
    reads (``metadata.labkit.labels``), one catalog entry each for all its cells."""
    return list(dict.fromkeys(nb.metadata.get("labkit", {}).get("labels", [])))


def _key(entry) -> tuple | str:
    """How an entry is found again: a markdown cell's by its id, a code string's by
    its cell and its text (a cell has several)."""
    return (entry.msgctxt, entry.msgid) if entry.msgctxt.endswith(CODE) else entry.msgctxt


def _closest(unmatched: dict, msgctxt: str, msgid: str):
    """Take the unmatched entry of the same code cell whose English is most like
    ``msgid`` (a string that was edited), or None when none is close."""
    import difflib

    scored = [(difflib.SequenceMatcher(None, msgid, key[1]).ratio(), key)
              for key in unmatched if isinstance(key, tuple) and key[0] == msgctxt]
    best = max(scored, default=(0.0, None))
    return unmatched.pop(best[1]) if best[0] >= 0.6 else None


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
    by_cell = {_key(entry): entry for entry in po}
    entries, new = [], 0
    for cell, msgid, note in _msgids(english):
        if cell.endswith(CODE):
            entry = by_cell.pop((cell, msgid), None) or _closest(by_cell, cell, msgid)
        else:
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


def _entry_problem(entry, msgid: str, outputs=()) -> str | None:
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
    return fidelity_problem(msgid, entry.msgstr, outputs)


# What a translation keeps verbatim: code blocks, code spans, formulas, link and image
# targets, and the number of headings (the book's table of contents and the lab's
# section numbers come from them). Code and API names stay English (TERMINOLOGY.md).
# A diagram (a ```text block, or one with no language) may change its words: it keeps
# its shape, the lines and the drawing characters on each.
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_DIAGRAM_INFO = {"", "text"}
_DRAWING = re.compile(r"[─-╿▀-▟■-◿←-⇿|+<>^*=_/\\-]")   # box, block, shape, arrow, ASCII
_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)   # a span may wrap lines
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.S)
_TARGET = re.compile(r"\]\(([^)\s]+)")
_HEADING = re.compile(r"^#{1,6} ", re.M)
_WORDS = re.compile(r"\\text\{[^}]*\}")   # a formula's words may be translated


def _shape(block: str) -> str:
    """A diagram's shape: one line of its drawing characters per line of it."""
    return "\n".join("".join(_DRAWING.findall(line)) for line in block.splitlines())


def _is_diagram(block: str) -> bool:
    return block.split("\n", 1)[0][3:].strip().lower() in _DIAGRAM_INFO


def _kept_parts(text: str) -> dict:
    found = _FENCE.findall(text)
    fences = [block for block in found if not _is_diagram(block)]
    prose = _FENCE.sub("", text)
    return {"code block": fences,
            "diagram (its lines and drawing characters)": [
                _shape(block) for block in found if _is_diagram(block)],
            "code span": [" ".join(m.group(2).split())   # rewrapped: same span
                                        for m in _SPAN.finditer(prose)],
            "formula": [_WORDS.sub(r"\\text{}", f) for f in _MATH.findall(_SPAN.sub("", prose))],
            "link target": _TARGET.findall(prose)}


def fidelity_problem(msgid: str, msgstr: str, outputs=()) -> str | None:
    """Say what of the English a translation lost (None when it kept everything):
    each code block, code span, formula and link target of ``msgid`` must appear in
    ``msgstr``, each diagram keeps its shape (its words may change), and both must
    have the same number of headings. A code span that quotes a line the course
    prints may become the translated line (``outputs``: coursetools.quoted_outputs)."""
    english, translated = _kept_parts(msgid), _kept_parts(msgstr)
    for kind, parts in english.items():
        missing = [part for part in dict.fromkeys(parts) if part not in translated[kind]
                   and not (kind == "code span" and outputs and quoted_outputs.
                            translated_span(part, translated[kind], outputs))]
        if missing:
            return f"the translation lost the {kind} {missing[0]!r}"
    headings = len(_HEADING.findall(_FENCE.sub("", msgid)))
    if len(_HEADING.findall(_FENCE.sub("", msgstr))) != headings:
        return f"the translation must keep the English's {headings} heading(s)"
    return None


def translate(english, po, lang: str, po_path, outputs=()) -> tuple:
    """Return (translated notebook, problems): the markdown and the code cells'
    strings from ``po``, the rest as is (``outputs``: the edition's printed lines,
    which a translated code span may quote)."""
    nb = nbformat.from_dict(english)
    name = f"{Path(po_path).stem}.ipynb"
    entries = {_key(e): e for e in po if not e.obsolete}
    msgids = {cell: msgid for cell, msgid, _ in _msgids(english) if not cell.endswith(CODE)}
    labels, problems = _translated_labels(english, entries, Path(po_path), name)
    for index, cell in enumerate(nb.cells):
        key = cell.get("id", f"cell-{index}")
        if cell.cell_type == "code":
            problems += _translate_code(cell, key, entries, Path(po_path), name,
                                        labels)
            continue
        if key not in msgids:
            continue
        entry = entries.pop(key, None)
        why = _entry_problem(entry, msgids[key], outputs)
        if why:
            problems.append(Problem(Path(po_path), name, key, why))
        else:
            cell.source = entry.msgstr
    if nb.cells and TIME_TOKEN in nb.cells[0].source:   # read from the translation
        nb.cells[0].source = nb.cells[0].source.replace(
            TIME_TOKEN, time_sentence(english, lang, nb))
    problems += [Problem(Path(po_path), name, key if isinstance(key, str) else key[0],
                         "its cell no longer exists" if isinstance(key, str)
                         else f"its string {key[1]!r} is no longer in the code")
                 for key in entries]
    nb.metadata.setdefault("labkit", {})["lang"] = lang
    return nb, problems


def _translated_labels(english, entries: dict, po_path: Path, name: str) -> tuple:
    """Return ({label: translation} of the usable ones, problems): a declared label
    must be in the code, and its entry translated."""
    labels, problems = {}, []
    code = [c.source for c in english.cells if c.cell_type == "code"]
    for label in _labels(english):
        entry = entries.pop((LABELS, label), None)
        why = ("the notebook declares it (metadata.labkit.labels) but no code cell has "
               "it" if not any(label in source for source in code)
               else _entry_problem(entry, label))
        if why:
            problems.append(Problem(po_path, name, "labels",
                                    f"{why} (label {label!r})"))
        else:
            labels[label] = entry.msgstr
    return labels, problems


def _translate_code(cell, key: str, entries: dict, po_path: Path, name: str,
                    labels: dict) -> list:
    """Write a code cell's translated strings in place; return the problems (each
    string without a usable translation keeps its English)."""
    done, problems = {}, []
    for literal in code_strings.strings(cell.source, labels):
        if literal.text in labels:
            why = code_strings.field_problem(literal.text, labels[literal.text],
                                             literal)
            if why:
                problems.append(Problem(po_path, name, key, why))
            else:
                done[literal.text] = labels[literal.text]
        if literal.text in done:
            continue
        entry = entries.pop((key + CODE, literal.text), None)
        why = (_entry_problem(entry, literal.text)
               or code_strings.field_problem(literal.text, entry.msgstr, literal))
        if why:
            problems.append(Problem(po_path, name, key, f"{why} (string "
                                    f"{literal.text[:60]!r})"))
        else:
            done[literal.text] = entry.msgstr
    translated = code_strings.replace(cell.source, done, labels)
    broken = done and code_strings.syntax_problem(translated)
    if broken:                  # a safety net: field_problem should have said why
        return problems + [Problem(po_path, name, key, f"the translated code does not "
                                   f"parse ({broken}); the cell keeps its English")]
    cell.source = translated
    return problems


def _printed(locale: Path, lang: str) -> list:
    """The ``lang`` edition's printed lines: labkit's and the code cells'."""
    return quoted_outputs.outputs(locale, lang, runtime_catalog(locale, lang))


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
    changed, problems, wanted, printed = [], [], set(), {}
    locale = solutions_dir.parent / LOCALE
    for lang, stem, po_path in catalogs(locale):
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
        solution, found = translate(english[name], po, lang, po_path,
                                    printed.setdefault(lang, _printed(locale, lang)))
        problems += found
        lab = make_lab(solution, f"{lang}/{name}",
                       _STUBS.get(lang, (CODE_STUB, TEXT_STUB)))
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
