"""The words a code cell shows the learner: its printed text, plot labels, docstrings.

Taught in: nowhere (course tooling, for the translated editions: coursetools.i18n).
A translated notebook keeps its code, but what that code prints or draws must be in
the reader's language. ``strings(source)`` finds each learner-facing string literal
of a code cell:

- what ``print`` shows (a literal, an f-string, a ``"...".format(...)`` template, a
  ``%`` template, a ``"sep".join(...)`` of those, or a ``+``/``if-else``/``or`` of
  those, and the literals inside an f-string's fields), what ``raise SomeError(...)``,
  an ``assert``'s message and ``warnings.warn`` say;
- the words of a plot or a widget: the first argument of ``set_title``, ``set_xlabel``,
  ``set_ylabel``, ``suptitle``, ``title``, ``xlabel``, ``ylabel``, ``text``,
  ``annotate``, ``Markdown``; the keywords ``label``, ``title``, ``what``,
  ``description``, ``xlabel``, ``ylabel``, ``desc`` and reveal's ``measured``,
  ``theory``, ``unit``; the lists of ``legend``, ``set_xticks``/``set_xticklabels``
  (and y), ``xticks``/``yticks`` and of the ``labels`` keywords;
- a string bound to a name that the cell uses only inside what it shows (assigned,
  looped over from a literal list, or returned by a function of that name): changing
  it cannot change what the code computes;
- the ``labels`` a notebook declares (metadata.labkit.labels), wherever they stand;
- docstrings (of a ``%%writefile`` module, its functions and classes, or a cell's);
- what a shell line echoes (``!nvidia-smi || echo "..."``).

Each is a ``Literal``: its text as written between the quotes (``{fields}`` of an
f-string or a template included verbatim), where it stands, and how it is quoted.
``replace(source, {text: translation})`` writes the translations back in place,
quoted as the English was; ``field_problem`` says when a translation lost or changed
a field, so that the translated code still runs.
"""

import ast
import re
from dataclasses import dataclass

__all__ = ["Literal", "strings", "replace", "field_problem", "syntax_problem"]

_LABEL_CALLS = {"print", "set_title", "set_xlabel", "set_ylabel", "suptitle", "title",
                "xlabel", "ylabel", "text", "annotate", "Markdown", "warn"}
_FIRST_ONLY = _LABEL_CALLS - {"print", "Markdown"}
_LABEL_KEYWORDS = {"label", "title", "what", "description", "xlabel", "ylabel", "desc",
                   "measured", "theory", "unit"}          # reveal's may be text
_LIST_CALLS = {"legend", "set_xticklabels", "set_yticklabels", "xticks", "yticks",
               "set_xticks", "set_yticks"}                # (ticks, labels)
_LIST_KEYWORDS = {"labels", "colLabels", "rowLabels"}
_PREFIX = re.compile(r"[rRbBuUfF]{0,2}")
_FIELD = re.compile(r"(?<!\{)\{(?!\{)[^{}]*\}")      # {x}, {x:.2f}, {}; not {{ }}
# What a reader reads: two lower-case Latin letters, or two of another script (not
# "DDP", "TP + SP", " GiB", "{x:.3f}": names, units and formats stay as they are).
_LETTERS = re.compile(r"[a-z]{2}|[^\W\d_A-Za-z]{2}")


@dataclass(frozen=True)
class Literal:
    """One learner-facing string literal: ``text`` as written between its quotes."""

    text: str
    start: int          # offsets into the cell's source (characters)
    end: int
    prefix: str         # e.g. "f", "" (one prefix for the whole literal)
    quote: str          # ', ", ''' or """
    pieces: int         # how many adjacent literals it was written as
    nested: bool = False    # in another literal's field: f"{'fits' if ok else 'no'}"
    formatted: bool = True  # an f-string or a .format() template: its {fields} are code


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
    """The string nodes an expression shows as text (literals, f-strings, templates);
    an f-string's own fields may show literals too (``f"{'fits' if ok else 'no'}"``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.JoinedStr):
        return [node] + [s for v in node.values if isinstance(v, ast.FormattedValue)
                         for s in _shown(v.value)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _shown(node.left) + (_shown(node.right)
                                    if isinstance(node.op, ast.Add) else [])
    if isinstance(node, ast.IfExp):
        return _shown(node.body) + _shown(node.orelse)
    if isinstance(node, ast.BoolOp):                     # errors or "valid"
        return [s for value in node.values for s in _shown(value)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "format":
            return _shown(node.func.value)
        if node.func.attr == "join" and node.args:         # "  ".join(f"..." for ...)
            joined = node.args[0]
            return (_shown(joined.elt) if isinstance(joined, (ast.GeneratorExp,
                                                               ast.ListComp))
                    else _listed(joined))
    return []


def _listed(node) -> list:
    """The strings of a list or tuple of labels (a legend's, a table's, ticks')."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return [s for item in node.elts for s in _shown(item)]
    return _shown(node)


def _name(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _shown_parts(node) -> list:
    """The expressions of a node that the learner reads as text."""
    if isinstance(node, ast.Call):
        name = _name(node.func)
        parts = []
        if name in _LABEL_CALLS:
            parts += [(_shown, a) for a in (node.args[:1] if name in _FIRST_ONLY
                                            else node.args)]
        if name in _LIST_CALLS:
            parts += [(_listed, a) for a in node.args]
        parts += [(_shown, k.value) for k in node.keywords if k.arg in _LABEL_KEYWORDS]
        parts += [(_listed, k.value) for k in node.keywords if k.arg in _LIST_KEYWORDS]
        return parts
    if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
        return [(_shown, a) for a in node.exc.args[:1]]
    if isinstance(node, ast.Assert) and node.msg is not None:
        return [(_shown, node.msg)]
    return []


def _only_shown_names(tree) -> set:
    """Names the cell uses only inside what it shows (a ``label`` it prints, a
    function whose result it prints): what is bound to them is shown text too, and
    translating it cannot change what the code computes."""
    inside, used = set(), {}
    for node in ast.walk(tree):
        for _how, part in _shown_parts(node):
            inside |= {id(n) for n in ast.walk(part) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            used[node.id] = used.get(node.id, True) and id(node) in inside
    return {name for name, only in used.items() if only}


def _bound(node, names: set) -> list:
    """The shown strings bound to ``names``: assigned, looped over from a literal
    list, or returned by a function of that name."""
    if (isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names):
        return _shown(node.value)
    if isinstance(node, ast.For) and isinstance(node.iter, (ast.List, ast.Tuple)):
        targets = (node.target.elts if isinstance(node.target, ast.Tuple)
                   else [node.target])
        found = []
        for item in node.iter.elts:
            values = item.elts if isinstance(item, ast.Tuple) else [item]
            found += [s for target, value in zip(targets, values)
                      if isinstance(target, ast.Name) and target.id in names
                      for s in _shown(value)]
        return found
    if isinstance(node, ast.FunctionDef) and node.name in names:
        return [s for n in ast.walk(node) if isinstance(n, ast.Return) and n.value
                for s in _shown(n.value)]
    return []


def _labelled(tree, labels) -> list:
    """The literals whose text is one of ``labels`` (not pieces of an f-string)."""
    pieces = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
              for v in n.values}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and n.value in labels and id(n) not in pieces]


def _candidates(tree, labels=()) -> list:
    names, found = _only_shown_names(tree), _labelled(tree, labels) if labels else []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr):
                found += _shown(first.value)[:1]           # the docstring
        found += [s for how, part in _shown_parts(node) for s in how(part)]
        found += _bound(node, names)
    return found


def _masked(source: str) -> str:
    """The cell's source with IPython's magic and shell lines blanked, same length."""
    return "\n".join(" " * len(line) if line.lstrip().startswith(("%", "!")) else line
                     for line in source.split("\n"))


def strings(source: str, labels=()) -> list[Literal]:
    """Return the learner-facing string literals of a code cell, in source order;
    ``labels``: texts the notebook declares to be words the learner reads wherever
    they stand, data too (a dict key its own cells print: metadata.labkit.labels)."""
    try:
        tree = ast.parse(_masked(source))
    except SyntaxError:
        return []
    lines, starts = source.splitlines(keepends=True) or [""], _offsets(source)
    found, seen = [], set()
    in_fields = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FormattedValue)
                 for n in ast.walk(f.value)}
    templates = {id(c.func.value) for c in ast.walk(tree) if isinstance(c, ast.Call)
                 and isinstance(c.func, ast.Attribute) and c.func.attr == "format"}
    for node in _candidates(tree, frozenset(labels)):
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
        found.append(Literal(text, start, end, prefix, quote, count,
                             nested=id(node) in in_fields,
                             formatted="f" in prefix or id(node) in templates))
    return sorted(found + _echoed(source), key=lambda lit: lit.start)


_ECHO = re.compile(r"""(?<![\w$])echo\s+(["'])((?:(?!\1)[^\\$`\n])*)\1""")


def _echoed(source: str) -> list[Literal]:
    """What a cell's shell line (``!nvidia-smi || echo "..."``) echoes, quoted
    plainly (no ``$``, backtick or backslash: nothing the shell would expand)."""
    found, at = [], 0
    for line in source.splitlines(keepends=True):
        if line.lstrip().startswith("!"):
            found += [Literal(m.group(2), at + m.start(2) - 1, at + m.end(2) + 1, "",
                              m.group(1), 1) for m in _ECHO.finditer(line)
                      if _LETTERS.search(m.group(2))]
        at += len(line)
    return found


def syntax_problem(source: str) -> str | None:
    """Say why a cell's code (magic and shell lines aside) does not parse; None if it
    does."""
    try:
        ast.parse(_masked(source))
    except SyntaxError as err:
        return f"line {err.lineno}: {err.msg}"
    return None


def _fields(text: str) -> list[str]:
    return sorted(_FIELD.findall(text))


def field_problem(english: str, translation: str, literal: Literal) -> str | None:
    """Say why ``translation`` cannot stand for ``english`` in the code; None if it can.

    The fields (``{name}``, ``{x:.2f}``) must be the same, and the translation must not
    close its own quotes. (In a plain string, a docstring, braces are just text.)"""
    if literal.formatted and _fields(english) != _fields(translation):
        return (f"the translation of {english!r} changed its fields: "
                f"{_fields(english)} became {_fields(translation)}")
    if literal.quote in translation.replace("\\" + literal.quote[0], ""):
        return f"the translation of {english!r} contains its quote {literal.quote}"
    if len(literal.quote) == 1 and "\n" in translation:
        return f"the translation of {english!r} breaks its one-line string"
    if literal.nested and re.search(r"[\\'\"]", translation):
        return (f"the translation of {english!r} stands in an f-string's field: it "
                "may hold no quote and no backslash")
    return None


def _quoted(lit: Literal, text: str) -> str:
    return f"{lit.prefix}{lit.quote}{text}{lit.quote}"


def replace(source: str, translations: dict, labels=()) -> str:
    """Write ``{english text: translation}`` into the cell, each quoted as before.

    A literal written as several adjacent pieces becomes one (its indentation kept
    for what follows); literals without a translation stay as they are. A literal
    inside an f-string's field is translated in that field, which the f-string's own
    translation keeps verbatim."""
    found = strings(source, labels)
    outers = [lit for lit in found if not any(
        o.start <= lit.start and lit.end <= o.end and o != lit for o in found)]
    out, last = [], 0
    for outer in outers:
        original = source[outer.start:outer.end]
        text = (_quoted(outer, translations[outer.text])
                if outer.text in translations else original)
        at = 0
        for inner in found:
            if (inner != outer and outer.start <= inner.start < outer.end
                    and inner.text in translations):
                was = source[inner.start:inner.end]
                where = text.find(was, at)
                if where >= 0:
                    now = _quoted(inner, translations[inner.text])
                    text = text[:where] + now + text[where + len(was):]
                    at = where + len(now)
        if text != original:
            out += [source[last:outer.start], text]
            last = outer.end
    return "".join(out) + source[last:]
