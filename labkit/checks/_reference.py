"""A way past every exercise: labkit's reference solution in place of the learner's.

Taught in: lab 00 ("How the exercises work"), then every lab (the last line of every
failing check). A stuck learner, or an instructor demoing a lab, runs one line, e.g.
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

A graded course's image is built with its references *locked* (``lock``: each room
keeps its exercise index, without the solved code): there ``use_reference`` says that
no reference is available, and ``reference_line`` offers none.
"""

import functools
import hashlib
import importlib
import json
import re
import sys
from pathlib import Path

from labkit import progress
from labkit.messages import _

__all__ = ["use_reference", "reference_line", "exercise_for", "check_frame",
           "available", "put_reference", "is_reference", "lock", "NoReference",
           "record_verdict", "record_begin"]

_ROOMS = Path(__file__).resolve().parents[1] / "labs"   # labkit/labs/<room>/
_CHECKS_MODULE = re.compile(r"^labkit\.labs\.(\w+)\.checks$")
_PUT: dict[str, str] = {}   # file exercise key -> digest of the reference put in place
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


class NoReference(LookupError):
    """A graded course: labkit's reference solutions are locked away."""


def check_frame():
    """Return the frame of the check the notebook called (the outermost frame in a
    room's checks module, ``labkit.labs.<room>.checks``), or None."""
    frame, found = sys._getframe(1), None
    while frame is not None:
        if _CHECKS_MODULE.match(frame.f_globals.get("__name__", "")):
            found = frame
        frame = frame.f_back
    return found


def _calling_check() -> tuple[str, str] | None:
    """Return (room, function) of the check now running, or None."""
    return _check_of(check_frame())


def _check_of(frame) -> tuple[str, str] | None:
    """(room, function) of a frame in a room's checks module, or None."""
    if frame is None:
        return None
    room = _CHECKS_MODULE.match(frame.f_globals["__name__"]).group(1)
    return room, frame.f_code.co_name


def running_exercise() -> dict | None:
    """Return the exercise record of the check now running, or None."""
    check = _calling_check()
    return exercise_for(check=check) if check else None


def available(ex: dict | None = None) -> bool:
    """Whether labkit's reference solution of ``ex`` (of any exercise: None) is here."""
    exercises = [ex] if ex is not None else _all_exercises()
    return any("source" in e for e in exercises)


def reference_line() -> str | None:
    """The line that takes the reference for the check now running, or None (no
    check, or a graded course)."""
    ex = running_exercise()
    return f'`checks.use_reference("{ex["key"]}")`' if ex and available(ex) else None


def use_reference(key: str) -> None:
    """Put labkit's reference solution of exercise ``key`` in place of yours.

    ``key`` is the file a program exercise writes (``"ddp_worker.py"``) or the name an
    exercise cell defines (``"shard_indices"``), as the "not done yet" message says.
    """
    ex = known_exercise(key)
    back = put_reference(ex, sys._getframe(1).f_globals)   # the notebook's namespace
    lab = ex["notebook"].removesuffix(".ipynb")
    print(_("⚠️  {title} ({lab}): now running labkit's REFERENCE solution for `{key}`, "
            "not your code. The rest of the lab uses it. To go back to your own, {back}"
            ).format(title=ex["title"] or key, lab=lab, key=key, back=back))
    record_verdict("reference", key=key)


def known_exercise(key: str) -> dict:
    """Return the exercise record of ``key``; a KeyError lists the known ones."""
    ex = exercise_for(key=key)
    if ex is None:
        known = ", ".join(repr(e["key"]) for e in _all_exercises())
        raise KeyError(_("labkit has no reference named {key!r}. Known: {known}.")
                       .format(key=key, known=known))
    return ex


def put_reference(ex: dict, namespace: dict) -> str:
    """Put the reference of ``ex`` in place (its file, or its names in ``namespace``);
    return how to go back to your own."""
    key = ex["key"]
    if not available(ex):
        raise NoReference(_(
            "{title}: this is a graded course, so labkit's reference solutions are not "
            "available here: the exercise is yours to solve.").format(
                title=ex["title"] or key))
    if ex["kind"] == "file":
        target = Path(ex["file"])
        kept = ""
        if target.exists() and target.read_text() != ex["source"]:
            mine = target.with_name(target.name + ".mine")
            mine.write_text(target.read_text())
            kept = _(" Your version is kept as {mine}.").format(mine=mine)
        target.write_text(ex["source"])
        _PUT[key] = digest(target)
        sys.modules.pop(target.stem, None)   # the next import reads the reference
        importlib.invalidate_caches()
        return _("re-run your `%%writefile {file}` cell.{kept}").format(
            file=ex["file"], kept=kept)
    exec(compile(ex["source"], reference_filename(key), "exec"), namespace)
    return _("re-run your own exercise cell.")


def record_verdict(event: str, key: str | None = None) -> None:
    """Note a verdict of the check now running (``failed``, ``passed``) or a reference
    taken (``reference``, with its ``key``) in the room's progress file, when the
    learner records one (``labkit.progress``); else do nothing."""
    if not progress.enabled():
        return
    if key is not None:
        ex = exercise_for(key=key)
    else:
        frame = check_frame()
        if frame is None:
            return
        check = _check_of(frame)
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


def digest(path) -> str | None:
    """The SHA-256 of the file at ``path``, or None if there is none."""
    path = Path(path)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def is_reference(ex: dict, code) -> bool:
    """Whether ``code`` (a module's path, or a function) is labkit's reference of
    ``ex`` as this kernel put it in place, not the learner's."""
    if ex["kind"] == "file":
        return ex["key"] in _PUT and digest(code) == _PUT[ex["key"]]
    filename = getattr(getattr(code, "__code__", None), "co_filename", "")
    return filename == reference_filename(ex["key"])


def reference_filename(key: str) -> str:
    """The file name the reference code of a cell exercise is compiled under."""
    return f"<labkit reference: {key}>"


def lock(rooms: Path = _ROOMS) -> list[Path]:
    """Drop the solved code from every room's reference store under ``rooms``, for a
    graded course's image; keep the exercise index. Return the files locked."""
    locked = []
    for path in sorted(Path(rooms).glob("*/reference.json")):
        store = json.loads(path.read_text())
        for ex in store["exercises"]:
            ex.pop("source", None)
        path.write_text(json.dumps(store, indent=1, ensure_ascii=False) + "\n")
        locked.append(path)
    _stores.cache_clear()
    return locked
