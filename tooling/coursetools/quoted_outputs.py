"""What the labs' text quotes of their own output, and whether it is what is printed.

Taught in: nowhere (course tooling, for the translated editions). A lab's text often
quotes a line the learner will see: "look for `[launch] still running`", "without
root: "needs root, skipped"". In a translation, the quote must be what the
translated run prints, not the English: labkit's messages come from labkit.po and a
code cell's prints from the lab's own catalog, so a Chinese quote of an English line
promises something the Chinese run never shows.

An output is a template, as its catalog holds it (``{fields}`` stand for any value);
``outputs`` collects every (English, translation) pair of a language. A quote (a code
span, or text between quotation marks) is a quoted output when it is part of some
output's English or translation, its numbers, ``N``/``M``/``K``, ``<...>`` and
ellipses standing for the values. ``problems`` says which quotes of a translated text
are only English output; ``translated_span`` lets a translation replace a code span
that quotes English output by the quote of the translated output (the fidelity rule
of coursetools.i18n keeps every other code span as it is).
"""

import re
from pathlib import Path

__all__ = ["outputs", "quotes", "quoted", "problems", "translated_span"]

_FIELD = re.compile(r"(?<!\{)\{(?!\{)[^{}]*\}")
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_MARKS = re.compile(r"“([^”\n]+)”|\"([^\"\n]+)\"|「([^」\n]+)」")
_HOLE = "\x00"                                     # a template's field, once rendered
_PLACEHOLDER = re.compile(r"<[^<>\s]+>|\.\.\.|…|\b[NMK]\b|\d[\d.,]*")
_WORDS = re.compile(r"[A-Za-z]{2,}|[\u4e00-\u9fff]{2,}")


def _rendered(template: str) -> str:
    """A template's text with each field a hole and whitespace collapsed."""
    return " ".join(_FIELD.sub(_HOLE, template.replace("{{", "{").replace("}}", "}"))
                    .split())


def outputs(locale_dir, lang: str, runtime_catalog) -> list[tuple[str, str]]:
    """Return (English, translation) of every output of the ``lang`` edition:
    labkit's messages (``runtime_catalog``) and the code cells' strings of every lab
    catalog in ``locale_dir`` (translated entries only)."""
    import polib

    paths = [Path(runtime_catalog)] + sorted(
        (Path(locale_dir) / lang / "LC_MESSAGES").glob("*.po"))
    found = {}
    for path in dict.fromkeys(paths):
        if not path.exists():
            continue
        for entry in polib.pofile(str(path)):
            code = not entry.msgctxt or entry.msgctxt.endswith(" code")
            if code and entry.msgstr.strip() and not entry.fuzzy and not entry.obsolete:
                found[(entry.msgid, entry.msgstr)] = None
    return [(_rendered(en), _rendered(tr)) for en, tr in found]


def quotes(markdown: str) -> list[str]:
    """The code spans and the quoted phrases of a markdown text (code blocks aside)."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    found = [m.group(1) for m in _SPAN.finditer(prose)]
    without_spans = _SPAN.sub(" ", prose)
    found += [next(g for g in m.groups() if g) for m in _MARKS.finditer(without_spans)]
    return [q.strip() for q in found if len(_WORDS.findall(q)) >= 2]


def _pattern(quote: str) -> re.Pattern:
    """A quote as a regex over rendered templates: its placeholders match a hole or
    a value, its spaces any spacing, its ends any boundary."""
    pieces, last = [], 0
    for m in _PLACEHOLDER.finditer(quote):
        pieces += [re.escape(quote[last:m.start()]),
                   rf"(?:{_HOLE}|{re.escape(m.group(0))}|\S{{0,12}}?)"]
        last = m.end()
    pieces.append(re.escape(quote[last:]))
    body = re.sub(r"(\\ )+", r"\\s*", "".join(pieces))
    return re.compile(body)


def quoted(quote: str, templates) -> list[int]:
    """Indices of the templates that ``quote`` is part of."""
    pattern = _pattern(" ".join(quote.split()))
    return [i for i, text in enumerate(templates) if pattern.search(text)]


def problems(markdown: str, pairs: list[tuple[str, str]]) -> list[str]:
    """Say which quotes of a translated text quote English output that the translated
    run does not print (each with what it prints instead)."""
    english, translated = [en for en, _ in pairs], [tr for _, tr in pairs]
    found = []
    for quote in quotes(markdown):
        if quoted(quote, translated):
            continue
        hits = quoted(quote, english)
        if hits:
            instead = translated[hits[0]].replace(_HOLE, "…")
            found.append(f"{quote!r} is English output; the translated run prints "
                         f"{instead[:160]!r}")
    return found


def translated_span(span: str, translation_spans: list[str], pairs) -> bool:
    """Does a translation stand for the English code span ``span`` with one of its own
    spans: ``span`` quotes an output whose translation one of them quotes?"""
    hits = quoted(span, [en for en, _ in pairs])
    return any(quoted(mine, [pairs[i][1] for i in hits]) for mine in translation_spans)
