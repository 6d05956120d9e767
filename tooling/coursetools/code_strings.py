"""The words a code cell shows the learner: its printed text, plot labels, docstrings.

Taught in: nowhere (course tooling, for the translated editions: coursetools.i18n).
A translated notebook keeps its code, but what that code prints or draws must be in
the reader's language. ``strings(source)`` finds each learner-facing string literal
of a code cell:

- what ``print`` shows (a literal, an f-string, a ``"...".format(...)`` template, or
  a ``+``/``if-else`` of those), and what ``raise SomeError(...)`` says;
- the words of a plot or a widget: the first argument of ``set_title``, ``set_xlabel``,
  ``set_ylabel``, ``suptitle``, ``title``, ``xlabel``, ``ylabel``, ``text``,
  ``annotate``, ``Markdown``, and the keywords ``label``, ``title``, ``what``,
  ``description``, ``xlabel``, ``ylabel``, ``desc``;
- docstrings (of a ``%%writefile`` module, its functions and classes, or a cell's).

Each is a ``Literal``: its text as written between the quotes (``{fields}`` of an
f-string or a template included verbatim), where it stands, and how it is quoted.
``replace(source, {text: translation})`` writes the translations back in place,
quoted as the English was; ``field_problem`` says when a translation lost or changed
a field, so that the translated code still runs.
"""

import ast
import re
from dataclasses import dataclass

__all__ = ["Literal", "strings", "replace", "field_problem"]

_LABEL_CALLS = {"print", "set_title", "set_xlabel", "set_ylabel", "suptitle", "title",
                "xlabel", "ylabel", "text", "annotate", "Markdown"}
_FIRST_ONLY = _LABEL_CALLS - {"print", "Markdown"}
_LABEL_KEYWORDS = {"label", "title", "what", "description", "xlabel", "ylabel", "desc"}
_PREFIX = re.compile(r"[rRbBuUfF]{0,2}")
_FIELD = re.compile(r"(?<!\{)\{(?!\{)[^{}]*\}")      # {x}, {x:.2f}, {}; not {{ }}
_LETTERS = re.compile(r"[^\W\d_]{2}")     # two letters of any script


@dataclass(frozen=True)
class Literal:
    """One learner-facing string literal: ``text`` as written between its quotes."""

    text: str
    start: int          # offsets into the cell's source (characters)
    end: int
    prefix: str         # e.g. "f", "" (one prefix for the whole literal)
    quote: str          # ', ", ''' or """
    pieces: int         # how many adjacent literals it was written as


def _offsets(source: str) -> list[int]:
    """Character offset of each line's start (ast gives lines and UTF-8 columns)."""
    starts, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def _char_offset(source_lines, starts, lineno: int, byte_col: int) -> int:
    line = source_lines[lineno - 1]
    return starts[lineno - 1] + len(line.encode("utf-8")[:byte_col].decode("utf-8"))


def _scan(segment: str) -> list[tuple[str, str, str]] | None:
    """Split the source of one string expression into its adjacent literals:
    [(prefix, quote, inner text)]; None when it is not a plain run of literals."""
    pieces, i = [], 0
    while i < len(segment):
        if segment[i] in " \t\n\r\\":
            i += 1
            continue
        if segment[i] == "#":                    # a comment between two pieces
            i = segment.find("\n", i) if "\n" in segment[i:] else len(segment)
            continue
        prefix = _PREFIX.match(segment, i).group(0)
        i += len(prefix)
        quote = next((q for q in ('"""', "'''", '"', "'") if segment.startswith(q, i)),
                     None)
        if quote is None:
            return None
        i += len(quote)
        j = i
        while j < len(segment) and not segment.startswith(quote, j):
            j += 2 if segment[j] == "\\" else 1
        if j >= len(segment):
            return None
        pieces.append((prefix, quote, segment[i:j]))
        i = j + len(quote)
    return pieces or None


def _join(pieces) -> tuple | None:
    """One literal from adjacent ones: (prefix, quote, text, count), or None.

    f-pieces and plain pieces may mix (the plain ones' braces are doubled, as in an
    f-string); raw and escaped pieces may not, nor different quotes."""
    if not pieces:
        return None
    raw = {"r" in p.lower() for p, _, _ in pieces}
    quotes = {q for _, q, _ in pieces}
    if len(raw) > 1 or len(quotes) > 1 or any("b" in p.lower() for p, _, _ in pieces):
        return None
    is_f = any("f" in p.lower() for p, _, _ in pieces)
    text = "".join(inner if "f" in p.lower() or not is_f
                   else inner.replace("{", "{{").replace("}", "}}")
                   for p, _, inner in pieces)
    prefix = ("r" if raw.pop() else "") + ("f" if is_f else "")
    return prefix, quotes.pop(), text, len(pieces)


def _shown(node) -> list:
    """The string nodes an expression shows as text (literals, f-strings, templates)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.JoinedStr):
        return [node]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _shown(node.left) + _shown(node.right)
    if isinstance(node, ast.IfExp):
        return _shown(node.body) + _shown(node.orelse)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"):
        return _shown(node.func.value)
    return []


def _name(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _candidates(tree) -> list:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr):
                found += _shown(first.value)[:1]           # the docstring
        elif isinstance(node, ast.Call):
            name = _name(node.func)
            if name in _LABEL_CALLS:
                args = node.args[:1] if name in _FIRST_ONLY else node.args
                found += [s for arg in args for s in _shown(arg)]
            found += [s for kw in node.keywords if kw.arg in _LABEL_KEYWORDS
                      for s in _shown(kw.value)]
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            found += [s for arg in node.exc.args[:1] for s in _shown(arg)]
    return found


def _masked(source: str) -> str:
    """The cell's source with IPython's magic and shell lines blanked, same length."""
    return "\n".join(" " * len(line) if line.lstrip().startswith(("%", "!")) else line
                     for line in source.split("\n"))


def strings(source: str) -> list[Literal]:
    """Return the learner-facing string literals of a code cell, in source order."""
    try:
        tree = ast.parse(_masked(source))
    except SyntaxError:
        return []
    lines, starts = source.splitlines(keepends=True) or [""], _offsets(source)
    found, seen = [], set()
    for node in _candidates(tree):
        start = _char_offset(lines, starts, node.lineno, node.col_offset)
        end = _char_offset(lines, starts, node.end_lineno, node.end_col_offset)
        if (start, end) in seen:
            continue
        seen.add((start, end))
        joined = _join(_scan(source[start:end]))
        if joined is None:
            continue      # not a plain run of literals, or raw and escaped mixed
        prefix, quote, text, count = joined
        if not _LETTERS.search(_FIELD.sub("", text)):
            continue      # nothing a reader reads: "{x:.3f}", " | "
        found.append(Literal(text, start, end, prefix, quote, count))
    return sorted(found, key=lambda lit: lit.start)


def _fields(text: str) -> list[str]:
    return sorted(_FIELD.findall(text))


def field_problem(english: str, translation: str, literal: Literal) -> str | None:
    """Say why ``translation`` cannot stand for ``english`` in the code; None if it can.

    The fields (``{name}``, ``{x:.2f}``) must be the same, and the translation must not
    close its own quotes."""
    if _fields(english) != _fields(translation):
        return (f"the translation of {english!r} changed its fields: "
                f"{_fields(english)} became {_fields(translation)}")
    if literal.quote in translation.replace("\\" + literal.quote[0], ""):
        return f"the translation of {english!r} contains its quote {literal.quote}"
    if len(literal.quote) == 1 and "\n" in translation:
        return f"the translation of {english!r} breaks its one-line string"
    return None


def replace(source: str, translations: dict) -> str:
    """Write ``{english text: translation}`` into the cell, each quoted as before.

    A literal written as several adjacent pieces becomes one (its indentation kept
    for what follows); literals without a translation stay as they are."""
    out, last = [], 0
    for lit in strings(source):
        if lit.text not in translations:
            continue
        out += [source[last:lit.start],
                f"{lit.prefix}{lit.quote}{translations[lit.text]}{lit.quote}"]
        last = lit.end
    return "".join(out) + source[last:]
