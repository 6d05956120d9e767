"""TERMINOLOGY.md as a rule: the forms it rules out, found in every Chinese catalog.

Taught in: nowhere (course tooling; ``tests/tooling/test_terminology.py`` runs it).
TERMINOLOGY.md is the one glossary of the notebooks' catalogs (``locale/<lang>/``)
and of labkit's messages (``labkit/locale/<lang>/``). Each of its tables has a column
``不用 (ruled out)``: the forms a translation must not use for that row's concept,
each in a code span, separated by ``;``. A form may name exceptions after
``except``: `` `精度` except `混合精度`, `数值精度` `` rules out 精度 but not inside
those words. A form written ``/…/`` is a regular expression.

A ruled-out form is allowed where TERMINOLOGY.md says the English stays (its "Kept as
is" section): inside a code span, a ``{field}`` of labkit's templates, a quoted
message (``'…'`` or ``"…"``), and, for English forms, inside a full-width gloss
（…） or as part of an identifier (``cfg.checkpoint``, ``block_plan()``,
``mesh=mesh``). English forms match whole words, in any case.
"""

import dataclasses
import re
from pathlib import Path

__all__ = ["Rule", "Use", "rules", "uses", "catalog_uses"]

_COLUMN = "不用"
_SPAN = re.compile(r"`([^`]+)`")
_CODE = re.compile(r"(`+).+?(?<!`)\1(?!`)", re.S)
_FIELD = re.compile(r"\{[^{}\s]*\}")
_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")
_GLOSS = re.compile(r"（[^（）]*）")
_ASCII = re.compile(r"^[A-Za-z][A-Za-z -]*$")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One ruled-out form: ``concept`` the row's English, ``term`` its Chinese."""
    concept: str
    term: str
    form: str
    exceptions: tuple[str, ...] = ()

    def pattern(self) -> re.Pattern:
        if self.form.startswith("/") and self.form.endswith("/") and len(self.form) > 2:
            return re.compile(self.form[1:-1])
        if _ASCII.match(self.form):   # a whole word, not part of an identifier
            return re.compile(rf"(?<![\w.(/=-]){re.escape(self.form)}(?![\w.(=-])",
                              re.IGNORECASE)
        return re.compile(re.escape(self.form))


@dataclasses.dataclass(frozen=True)
class Use:
    """A ruled-out form found in a catalog entry."""
    catalog: Path
    entry: str
    rule: Rule
    found: str

    def __str__(self) -> str:
        return (f"{self.catalog}: entry {self.entry}: uses {self.found!r} for "
                f"{self.rule.concept!r}; TERMINOLOGY.md says {self.rule.term}")


def _cells(line: str) -> list[str]:
    # A backslash-escaped or code-span pipe is part of a cell, not a border.
    parts, cell, code = [], "", False
    for char in line.strip().strip("|"):
        if char == "`":
            code = not code
        if char == "|" and not code:
            parts.append(cell.strip())
            cell = ""
        else:
            cell += char
    return parts + [cell.strip()]


def _rules_of(cell: str, concept: str, term: str) -> list[Rule]:
    found = []
    for clause in cell.split(";"):
        form, _, exceptions = clause.partition("except")
        spans = _SPAN.findall(form)
        if spans:
            found.append(Rule(concept, term, spans[0],
                              tuple(_SPAN.findall(exceptions))))
    return found


def rules(glossary) -> list[Rule]:
    """Read every ruled-out form of TERMINOLOGY.md (its path)."""
    found, header = [], None
    for line in Path(glossary).read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        column = next((i for i, name in enumerate(header) if name.startswith(_COLUMN)),
                      None)
        if column is not None and column < len(cells):
            found += _rules_of(cells[column], cells[0], cells[1])
    return found


def _prose(text: str) -> tuple[str, str]:
    """Return (the text without code, fields and quotes; that without glosses too)."""
    text = _QUOTED.sub(" ", _FIELD.sub(" ", _CODE.sub(" ", text)))
    return text, _GLOSS.sub(" ", text)


def uses(text: str, ruleset: list[Rule]) -> list[tuple[Rule, str]]:
    """Return (rule, what matched) for each ruled-out form ``text`` uses."""
    prose, unglossed = _prose(text)
    found = []
    for rule in ruleset:
        where = unglossed if _ASCII.match(rule.form) else prose
        for word in rule.exceptions:
            where = where.replace(word, " ")
        found += [(rule, match.group(0)) for match in rule.pattern().finditer(where)]
    return found


def catalog_uses(catalog, ruleset: list[Rule]) -> list[Use]:
    """Every ruled-out form in a catalog's translations (all live entries)."""
    import polib

    found = []
    for entry in polib.pofile(str(catalog)):
        if entry.obsolete or not entry.msgstr:
            continue
        name = entry.msgctxt or repr(entry.msgid[:50])
        found += [Use(Path(catalog), name, rule, word)
                  for rule, word in uses(entry.msgstr, ruleset)]
    return found
