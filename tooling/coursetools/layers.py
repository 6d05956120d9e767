"""The course's three layers, read from its imports: tooling, the labs' rooms, runtime.

Taught in: nowhere (for maintainers; the book's architecture page shows the drawing).
Every import between the course's own modules, lazy ones inside functions included,
is an arrow. Arrows may only point down (tooling -> rooms -> runtime) or stay in a
layer; a room never imports another room; and no module reaches itself again
(no circles). The ``labkit`` command (``labkit.cli``) is the entry point above the
layers and may name all three. ``problems`` lists what breaks these rules (the tests
fail on any); ``drawing`` is the picture ``labkit build-labs`` keeps in
book/architecture.md.
"""

import ast
from pathlib import Path

__all__ = ["LAYERS", "ENTRY", "modules", "layer", "arrows", "problems", "drawing"]

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("tooling", "rooms", "runtime")          # top to bottom
ENTRY = {"labkit.cli"}
_PACKAGES = {"labkit": ROOT / "labkit", "coursetools": ROOT / "tooling" / "coursetools"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Return {dotted module name: file} for labkit and coursetools."""
    found = {}
    for package, folder in _PACKAGES.items():
        folder = root / folder.relative_to(ROOT)
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def layer(module: str) -> str:
    """Return the layer of a module: tooling, rooms, runtime (or entry)."""
    if module in ENTRY:
        return "entry"
    if module.startswith("coursetools"):
        return "tooling"
    if module == "labkit.labs" or module.startswith("labkit.labs."):
        return "rooms"
    return "runtime"


def room(module: str) -> str | None:
    """Return the room a module belongs to (``labkit.labs.<room>...``), or None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["labkit", "labs"] else None


def _targets(node, known: set) -> set[str]:
    """The project modules an import statement reaches (the deepest known name)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [f"{node.module}.{alias.name}" for alias in node.names] or [node.module]
        names = [n if n in known else node.module for n in names]
    else:
        return set()
    hits = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            hits.add(name)
    return hits


def arrows(root: Path = ROOT) -> set[tuple[str, str]]:
    """Return every (importer, imported) pair between the course's own modules."""
    found = modules(root)
    known = set(found)
    pairs = set()
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text())):
            pairs |= {(name, target) for target in _targets(node, known)
                      if target != name}
    return pairs


def _cycles(pairs: set) -> list[list[str]]:
    """Return the strongly connected groups of more than one module (Tarjan)."""
    graph = {}
    for a, b in pairs:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, groups, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _is_package_of(a: str, b: str) -> bool:
    """A package's __init__ importing its own submodule (or a module its package)."""
    return b.startswith(a + ".") or a.startswith(b + ".")


def problems(root: Path = ROOT) -> list[str]:
    """Say which arrows point up or sideways between rooms, and which modules form a
    circle; an empty list means the layers hold."""
    pairs = arrows(root)
    rank = {name: i for i, name in enumerate(LAYERS)}
    found = []
    for a, b in sorted(pairs):
        la, lb = layer(a), layer(b)
        if la == "entry":
            continue
        if lb == "entry" or rank[lb] < rank[la]:
            found.append(f"upward: {a} ({la}) imports {b} ({lb})")
        elif la == lb == "rooms" and room(a) and room(b) and room(a) != room(b):
            found.append(f"sideways: room {room(a)} ({a}) imports room {room(b)} ({b})")
    circles = _cycles({(a, b) for a, b in pairs if not _is_package_of(a, b)})
    found += [f"circle: {' -> '.join(group)}" for group in circles]
    return found


def drawing(root: Path = ROOT) -> str:
    """Return the picture of the layers: each with its modules, and which layers below
    it each one imports from (counts of lines or imports would change with every
    edit; the picture changes only when the architecture does)."""
    found = modules(root)
    pairs = arrows(root)
    by_layer = {name: [m for m in found if layer(m) == name] for name in LAYERS}
    out = []
    for name in LAYERS:
        members = by_layer[name]
        if name == "rooms":
            rooms = sorted({room(m) for m in members if room(m)})
            listing = ", ".join(f"{r} ({sum(1 for m in members if room(m) == r)})"
                                for r in rooms)
            title = f"rooms    labkit.labs: {len(rooms)} rooms, modules per room"
        else:
            short = sorted(m.split(".", 1)[1] if "." in m else "__init__" for m in members)
            listing = ", ".join(s for s in short if s)
            title = ("tooling  coursetools (tooling/, not in the learner image)"
                     if name == "tooling" else "runtime  labkit (what every lab and rank imports)")
        out.append(f"{title}: {len(members)} modules")
        out += [f"    {line}" for line in _wrap(listing, 80)]
        below = LAYERS[LAYERS.index(name) + 1:]
        reached = [target for target in below
                   if any(layer(a) == name and layer(b) == target for a, b in pairs)]
        if below:
            out.append(f"        |  imports from: {', '.join(reached) or 'nothing below'}")
            out.append("        v")
    entry = sorted({layer(b) for a, b in pairs if layer(a) == "entry"})
    out.append(f"entry    labkit.cli (the `labkit` command) imports: {', '.join(entry)}")
    out.append(f"upward or sideways imports, circles: {len(problems(root))}")
    return "\n".join(out) + "\n"


def _wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + ([line] if line else [])
