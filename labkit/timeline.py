"""Record when each stage runs each forward/backward, and draw it as a Gantt chart.

Taught in: lab 04 (only one device works at a time) and lab 05 (the pipeline bubble).
``Recorder`` stamps real runs: CUDA events on a GPU, the wall clock on the CPU
(``time.perf_counter`` is one system-wide clock on Linux, so ranks' events line up).
``Watch`` records a stage from the outside (hooks) while the learner's code runs it:
the order of forwards and backwards, their times, and the activations held.
``draw`` and ``as_text`` also take a ``pipeline.schedule`` table: same picture, no run.
"""

import os
import time
import unicodedata
import warnings
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from labkit.messages import _, language

__all__ = ["Event", "Recorder", "Watch", "from_table", "draw", "as_text",
           "busy_overlap", "use_cjk_font"]

COLOURS = {"F": "#4c72b0", "B": "#dd8452"}   # forward blue, backward orange
IDLE_COLOUR = "#e6e6e6"                       # grey where a row does nothing

# Fonts with Chinese glyphs, best first: matplotlib's own DejaVu Sans has none, and a
# Chinese title drawn in it is a row of boxes ("Glyph ... missing from font").
CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK TC",
             "Source Han Sans SC", "Source Han Sans CN", "WenQuanYi Zen Hei",
             "WenQuanYi Micro Hei", "Droid Sans Fallback", "SimHei", "Microsoft YaHei",
             "PingFang SC", "Heiti SC", "Arial Unicode MS")
_CJK_FILES = ("CJK", "SourceHan", "wqy", "WenQuanYi", "DroidSansFallback")
_cjk_found: list | None = None   # the CJK fonts matplotlib knows, once looked up


def _installed_cjk_fonts() -> list:
    """Return the names in ``CJK_FONTS`` matplotlib can use, best first.

    matplotlib's font cache is built once; fonts installed after it (apt install
    fonts-noto-cjk) are missing from it, so the system's CJK files are added then.
    """
    global _cjk_found
    if _cjk_found is None:
        from matplotlib import font_manager

        def known() -> list:
            names = {font.name for font in font_manager.fontManager.ttflist}
            return [name for name in CJK_FONTS if name in names]

        found = known()
        if not found:
            for path in font_manager.findSystemFonts():
                if any(tag in os.path.basename(path) for tag in _CJK_FILES):
                    try:
                        font_manager.fontManager.addfont(path)
                    except (OSError, RuntimeError, ValueError):
                        pass   # a file FreeType cannot read: skip it
            found = known()
        _cjk_found = found
    return _cjk_found


def use_cjk_font() -> list:
    """In a language other than English, put a CJK font first in matplotlib's sans-serif
    fallback (and draw "-" as a hyphen, which every CJK font has); return the CJK fonts
    put first. Every labkit function that draws calls it; warns once without one.
    """
    if language() == "en":
        return []
    import matplotlib as mpl

    found = _installed_cjk_fonts()
    if not found:
        if not getattr(use_cjk_font, "warned", False):
            use_cjk_font.warned = True
            warnings.warn(_("Chinese labels need a CJK font: apt install "
                            "fonts-noto-cjk"), stacklevel=2)
        return []
    current = list(mpl.rcParams["font.sans-serif"])
    if current[:len(found)] != found:
        mpl.rcParams["font.sans-serif"] = found + [f for f in current if f not in found]
    mpl.rcParams["axes.unicode_minus"] = False
    return found


def _ljust(text: str, width: int) -> str:
    """``text`` padded to ``width`` columns of a terminal (a CJK character is two)."""
    used = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    return text + " " * max(width - used, 0)


@dataclass(frozen=True)
class Event:
    """One forward ("F") or backward ("B") of one micro-batch on one row (stage/rank).

    ``start`` and ``end`` are seconds on the recorder's clock (steps for tables).
    """

    row: int
    kind: str
    microbatch: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Recorder:
    """Collect ``Event``s for one row (a rank or stage) of a real run.

    On CUDA the stamps are events queued on the stream (no sync inside the loop);
    ``events()`` synchronises once and converts them to the wall clock.
    """

    def __init__(self, row: int = 0, device="cpu"):
        self.row = row
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._done: list = []
        if self.cuda:   # "cuda" alone: the current device, fixed now
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.synchronize(self.device)
            self._origin, self._origin_wall = self._cuda_event(), time.perf_counter()

    def _cuda_event(self):
        """An event on this recorder's device's current stream (not the current
        device's: a rank may record for cuda:1 while cuda:0 is current)."""
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    @contextmanager
    def record(self, kind: str, microbatch: int = 0, row: int | None = None):
        """Time the body of a ``with`` block as one event of ``kind`` ("F" or "B")."""
        if kind not in COLOURS:
            raise ValueError(_("kind must be 'F' (forward) or 'B' (backward), got "
                               "{kind!r}.").format(kind=kind))
        row = self.row if row is None else row
        start = self._cuda_event() if self.cuda else time.perf_counter()
        yield
        end = self._cuda_event() if self.cuda else time.perf_counter()
        self._done.append((row, kind, microbatch, start, end))

    def events(self) -> list[Event]:
        """Return the recorded events, in seconds on the wall clock."""
        if not self.cuda:
            return [Event(*item) for item in self._done]
        torch.cuda.synchronize(self.device)

        def wall(event) -> float:
            return self._origin_wall + self._origin.elapsed_time(event) / 1e3

        return [Event(row, kind, mb, wall(start), wall(end))
                for row, kind, mb, start, end in self._done]


def from_table(table: list[list], forward: float = 1.0, backward: float = 1.0):
    """Turn a rank x step schedule table into events, one step per action.

    With ``forward != backward`` each step lasts as long as its longest action.
    """
    events = []
    clock = 0.0
    for step in range(max(len(row) for row in table)):
        actions = [row[step] if step < len(row) else None for row in table]
        for rank, action in enumerate(actions):
            if action is not None:
                length = forward if action.kind == "F" else backward
                events.append(Event(rank, action.kind, action.microbatch, clock,
                                    clock + length))
        kinds = {a.kind for a in actions if a is not None}
        lengths = [forward if kind == "F" else backward for kind in kinds]
        clock += max(lengths, default=forward)
    return events


def _as_events(timeline) -> tuple[list[Event], bool]:
    """Return events and whether they came from a table (unit steps)."""
    if timeline and isinstance(timeline[0], list):
        return from_table(timeline), True
    if not timeline:
        raise ValueError(_("Nothing to draw: the timeline holds no events."))
    return list(timeline), False


def draw(timeline, ax=None, title: str | None = None, row_label: str | None = None):
    """Draw a Gantt chart: one row per stage, forward blue, backward orange, idle grey.

    ``timeline`` is a list of ``Event``s (time in ms from the first start) or a
    schedule table (time in steps). ``row_label`` names the rows ("rank"; default:
    "stage", in the learner's language). Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    use_cjk_font()
    row_label = _("stage") if row_label is None else row_label

    events, is_table = _as_events(timeline)
    origin = min(e.start for e in events)
    scale = 1.0 if is_table else 1e3
    span = (max(e.end for e in events) - origin) * scale
    rows = sorted({e.row for e in events})
    if ax is None:
        _fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(rows)))
    for row in rows:
        ax.barh(row, span, left=0, height=0.8, color=IDLE_COLOUR)
    for e in events:
        left, width = (e.start - origin) * scale, e.seconds * scale
        ax.barh(e.row, width, left=left, height=0.8, color=COLOURS[e.kind],
                edgecolor="white", linewidth=0.5)
        if width > span / 60:
            ax.text(left + width / 2, e.row, str(e.microbatch), ha="center",
                    va="center", fontsize=7, color="white")
    ax.set_yticks(rows, [f"{row_label} {r}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, span)
    ax.set_xlabel(_("time step") if is_table else _("time (ms)"))
    ax.legend(handles=[Patch(color=COLOURS["F"], label=_("forward")),
                       Patch(color=COLOURS["B"], label=_("backward")),
                       Patch(color=IDLE_COLOUR, label=_("idle (bubble)"))],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def as_text(table: list[list]) -> str:
    """Render a rank x step table as text: one line per step, one column per rank."""
    if not table or not isinstance(table[0], list):
        raise ValueError(_("as_text takes a rank x step table from pipeline.schedule."))
    interleaved = any(a is not None and a.stage != rank
                      for rank, row in enumerate(table) for a in row)

    def cell(action) -> str:
        if action is None:
            return "."
        return f"{action.stage}{action}" if interleaved else str(action)

    ranks = "".join(f"rank {r:<3}" for r in range(len(table)))
    lines = [_ljust(_("step"), 4) + " " + ranks]
    for step in range(max(len(row) for row in table)):
        slots = [row[step] if step < len(row) else None for row in table]
        lines.append(f"{step:>4} " + "".join(f"{cell(a):<8}" for a in slots))
    return "\n".join(lines)


def busy_overlap(events: list[Event]) -> float:
    """Return the seconds during which two or more rows are busy at the same time."""
    edges = sorted([(e.start, 1) for e in events] + [(e.end, -1) for e in events])
    overlap, busy, last = 0.0, 0, None
    for moment, change in edges:
        if busy >= 2 and last is not None:
            overlap += moment - last
        busy += change
        last = moment
    return overlap


class _Held:
    """What autograd keeps for a saved tensor while we count it (see Watch._pack)."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class Watch:
    """Record what one rank's stage does inside a ``with`` block.

    ``order``: ("F", k) when the stage's k-th forward ends, ("B", k) when the gradient
    of that forward's output arrives. ``events``: ``timeline.Event`` spans, F for each
    forward of the stage, B for each ``backward`` call; waiting in a recv is in
    neither. ``peak_held``: most micro-batches forwarded and not yet backwarded;
    ``peak_bytes``: most bytes autograd saved for backward at once (weights
    excluded). On a GPU each boundary synchronises, so the clock is the device's.
    """

    def __init__(self, stage, rank: int = 0, device="cpu", first_index: int = 0,
                 saved_bytes: bool = True):
        self.stage, self.rank, self.device = stage, rank, torch.device(device)
        self.saved_bytes = saved_bytes   # False: the order and events only (cheaper)
        self.order, self.events = [], []
        self.held = self.peak_held = self.peak_bytes = 0
        self._index, self._first = 0, first_index
        self._live, self._bytes = {}, 0   # (data_ptr, bytes) -> [count, bytes]
        self._params = {(p.to_local() if hasattr(p, "to_local") else p)   # a DTensor
                        .untyped_storage().data_ptr()
                        for p in stage.parameters()} if saved_bytes else set()
        self._reached, self._hooks, self._saved = [], [], None

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _event(self, kind: str, index: int, start: float) -> None:
        self.events.append(Event(self.rank, kind, self._first + index, start,
                                 self._now()))

    def _before_forward(self, module, args):
        self._started = self._now()

    def _after_forward(self, module, args, output):
        index, self._index = self._index, self._index + 1
        self._event("F", index, self._started)
        self.order.append(("F", index))
        self.held += 1
        self.peak_held = max(self.peak_held, self.held)
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: self._gradient_reached(index))

    def _gradient_reached(self, index: int) -> None:
        self.order.append(("B", index))
        self.held -= 1
        self._reached.append(index)

    def _backward(self, *args, **kwargs):
        start, self._reached = self._now(), []
        result = self._real_backward(*args, **kwargs)
        self._event("B", self._reached[0] if self._reached else -1, start)
        return result

    def _pack(self, tensor):
        if tensor.untyped_storage().data_ptr() in self._params:
            return tensor   # a weight, not an activation
        size = tensor.numel() * tensor.element_size()
        key = (tensor.data_ptr(), size)   # one tensor saved by two ops counts once
        entry = self._live.setdefault(key, [0, size])
        if entry[0] == 0:
            self._bytes += size
            self.peak_bytes = max(self.peak_bytes, self._bytes)
        entry[0] += 1
        held = _Held(tensor)
        weakref.finalize(held, self._release, key)   # autograd let go of it
        return held

    def _release(self, key) -> None:
        entry = self._live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self._bytes -= entry[1]
            del self._live[key]

    def __enter__(self):
        self._hooks = [self.stage.register_forward_pre_hook(self._before_forward),
                       self.stage.register_forward_hook(self._after_forward)]
        self._real_backward, torch.autograd.backward = (torch.autograd.backward,
                                                        self._backward)
        if self.saved_bytes:
            self._saved = torch.autograd.graph.saved_tensors_hooks(
                self._pack, lambda held: held.tensor if isinstance(held, _Held) else held)
            self._saved.__enter__()
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            self._saved.__exit__(*exc)
        torch.autograd.backward = self._real_backward
        for hook in self._hooks:
            hook.remove()
        return False
