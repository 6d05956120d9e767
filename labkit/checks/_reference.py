"""A way past every exercise: labkit's reference solution in place of the learner's.

Taught in: every lab (the last line of each "not done yet" message). A stuck learner,
or an instructor demoing a lab, runs one line, e.g.
``checks.use_reference("ddp_worker.py")``, and the rest of the lab runs on the
reference:

- for a program exercise (a ``%%writefile`` cell) the reference module is written
  where the cell writes it; the learner's own file is kept beside it as ``*.mine``;
- for an exercise that defines a function in the notebook, the reference cell runs in
  the notebook's namespace, so the name now means the reference.

The references are the solved cells of ``solutions/``, copied into each lab's room
(``labkit/labs/<room>/reference.json``) by ``labkit build-labs`` (and checked for
drift by ``labkit build-labs --check``), so the course image ships them without
shipping the solution notebooks. Going back is re-running your own cell.
"""

import functools
import importlib
import json
import re
import sys
from pathlib import Path

from labkit import progress
from labkit.messages import _

__all__ = ["use_reference", "reference_line", "exercise_for", "record_verdict",
           "record_begin"]

_ROOMS = Path(__file__).resolve().parents[1] / "labs"   # labkit/labs/<room>/
_CHECKS_MODULE = re.compile(r"^labkit\.labs\.(\w+)\.checks$")
_ROOM_MODULE = re.compile(r"^labkit\.labs\.(\w+)(\.|$)")
_NUMBER = re.compile(r"Exercise\s+(\d+\.\d+)")
_last_failed = {"frame": None}   # the check whose failure was recorded last


@functools.cache
def _stores() -> tuple[dict, ...]:
    return tuple(json.loads(p.read_text())
                 for p in sorted(_ROOMS.glob("*/reference.json")))


def _all_exercises() -> list[dict]:
    return [dict(ex, notebook=s["notebook"], room=s["room"])
            for s in _stores() for ex in s["exercises"]]


def exercise_for(key: str | None = None, check: tuple[str, str] | None = None):
    """Return the exercise record for a reference ``key`` or a (room, check function)
    pair; None when there is none."""
    for ex in _all_exercises():
        if key is not None and ex["key"] == key:
            return ex
        if check is not None and (ex["room"], ex["check"]) == check:
            return ex
    return None


def _calling_check_frame():
    """Find the check the notebook called: the outermost frame in a room's checks
    module (``labkit.labs.<room>.checks``); return (frame, (room, function))."""
    frame, found = sys._getframe(1), None
    while frame is not None:
        match = _CHECKS_MODULE.match(frame.f_globals.get("__name__", ""))
        if match:
            found = (frame, (match.group(1), frame.f_code.co_name))
        frame = frame.f_back
    return found


def _calling_check() -> tuple[str, str] | None:
    """Return (room, function) of the check the notebook called, or None."""
    found = _calling_check_frame()
    return found[1] if found else None


def reference_line() -> str | None:
    """The line that takes the reference for the check now running, or None."""
    check = _calling_check()
    ex = exercise_for(check=check) if check else None
    return f'`checks.use_reference("{ex["key"]}")`' if ex else None


def use_reference(key: str) -> None:
    """Put labkit's reference solution of exercise ``key`` in place of yours.

    ``key`` is the file a program exercise writes (``"ddp_worker.py"``) or the name an
    exercise cell defines (``"shard_indices"``), as the "not done yet" message says.
    """
    ex = exercise_for(key=key)
    if ex is None:
        known = ", ".join(repr(e["key"]) for e in _all_exercises())
        raise KeyError(_("labkit has no reference named {key!r}. Known: {known}.")
                       .format(key=key, known=known))
    lab = ex["notebook"].removesuffix(".ipynb")
    title = ex["title"] or key
    if ex["kind"] == "file":
        target = Path(ex["file"])
        kept = ""
        if target.exists() and target.read_text() != ex["source"]:
            mine = target.with_name(target.name + ".mine")
            mine.write_text(target.read_text())
            kept = _(" Your version is kept as {mine}.").format(mine=mine)
        target.write_text(ex["source"])
        sys.modules.pop(target.stem, None)   # the next import reads the reference
        importlib.invalidate_caches()
        back = _("re-run your `%%writefile {file}` cell.{kept}").format(
            file=ex["file"], kept=kept)
    else:
        namespace = sys._getframe(1).f_globals   # the notebook's, when called from it
        exec(compile(ex["source"], f"<labkit reference: {key}>", "exec"), namespace)
        back = _("re-run your own exercise cell.")
    print(_("⚠️  {title} ({lab}): now running labkit's REFERENCE solution for `{key}`, "
            "not your code. The rest of the lab uses it. To go back to your own, {back}")
          .format(title=title, lab=lab, key=key, back=back))
    record_verdict("reference", key=key)


def record_verdict(event: str, key: str | None = None) -> None:
    """Note a verdict of the check now running (``failed``, ``passed``) or a reference
    taken (``reference``, with its ``key``) in the room's progress file, when the
    learner records one (``labkit.progress``); else do nothing."""
    if not progress.enabled():
        return
    if key is not None:
        ex = exercise_for(key=key)
    else:
        found = _calling_check_frame()
        if found is None:
            return
        frame, check = found
        if event == "failed":
            # a check that adds detail re-raises a second ExerciseFailed: one attempt.
            # Holding the frame (as IPython's last traceback does) keeps its id unique.
            if frame is _last_failed["frame"]:
                return
            _last_failed["frame"] = frame
        ex = exercise_for(check=check)
    if ex is not None:
        number = _NUMBER.search(ex["title"] or "")
        progress.record(event, ex["room"], ex["notebook"].removesuffix(".ipynb"),
                        number.group(1) if number else None, ex["key"])


def record_begin(namespace: dict) -> None:
    """Note that a lab's setup cell ran; its room is the one ``namespace`` (the
    notebook's) imported its checks from."""
    if not progress.enabled():
        return
    rooms = {match.group(1) for value in namespace.values()
             if (match := _ROOM_MODULE.match(getattr(value, "__name__", "") or ""))
             and type(value).__name__ == "module"}
    room = rooms.pop() if len(rooms) == 1 else None
    lab = next((s["notebook"].removesuffix(".ipynb") for s in _stores()
                if s["room"] == room), None)
    progress.opened(room, lab)
