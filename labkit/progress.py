"""A room's own times: each check's verdicts, recorded locally when the learner opts in.

Taught in: nowhere (for instructors: INSTRUCTORS.md, "Measure your own room"). Off by
default. On with ``LABKIT_RECORD=1`` in the environment (a hub can set it for every
learner) or ``progress.start()`` in a notebook. Then every check appends one line to
``labkit-progress.jsonl`` in the notebook's folder, a plain file the learner can open
and delete:

    {"v": 1, "at": "2026-12-03T10:15:02Z", "room": "ddp", "lab": "03_ddp",
     "exercise": "3.3", "key": "ddp_worker.py", "event": "failed", "since_start_s": 754}

``event`` is ``begin`` (the lab's setup cell ran), ``failed`` or ``passed`` (a
check's verdict: each is one attempt) or ``reference`` (the learner took labkit's
reference solution); ``since_start_s`` counts from the lab's first line in the file.
No name, no host, no code, nothing sent anywhere: ``labkit room gather`` (the course
tooling) reads the files an instructor collects and makes the room's table.
"""

import datetime
import json
import multiprocessing
import os
import time
from pathlib import Path

from labkit.messages import _

__all__ = ["ENV", "FILE_NAME", "enabled", "start", "stop", "path", "opened", "record",
           "read", "seconds"]

ENV = "LABKIT_RECORD"
FILE_NAME = "labkit-progress.jsonl"
VERSION = 1
_state = {"started": False, "announced": False}


def _now() -> float:
    return time.time()   # a test replaces it with a scripted clock


def _in_a_rank() -> bool:
    """Ranks inherit the environment; only the learner's own process records."""
    return (multiprocessing.parent_process() is not None
            or "TORCHELASTIC_RUN_ID" in os.environ)


def enabled() -> bool:
    """Tell whether verdicts are recorded here (``LABKIT_RECORD`` or ``start()``)."""
    switched = os.environ.get(ENV, "").strip().lower() in {"1", "true", "yes", "on"}
    return (switched or _state["started"]) and not _in_a_rank()


def path() -> Path:
    """The file the records go to: ``labkit-progress.jsonl`` beside the notebook."""
    return Path.cwd() / FILE_NAME


def _announce() -> None:
    if not _state["announced"]:
        _state["announced"] = True
        print(_("Recording this room's times: each check adds one line (exercise, "
                "verdict, time; nothing personal, nothing sent) to {file}. Open it "
                "any time; delete it to forget.").format(file=path()))


def start() -> None:
    """Record this notebook's verdicts from now on (until ``stop()``), and say where."""
    _state["started"] = True
    _announce()


def stop() -> None:
    """Stop recording (the file stays; delete it to forget)."""
    _state["started"] = False
    os.environ.pop(ENV, None)


def read(file) -> list[dict]:
    """Return the records of one file, oldest first; a line that is not a record of
    this format (torn, edited by hand) is skipped."""
    records = []
    for line in Path(file).read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("v") == VERSION and "event" in entry:
            records.append(entry)
    return records


def seconds(entry: dict) -> float:
    """The moment of a record, in seconds since the epoch."""
    return datetime.datetime.fromisoformat(entry["at"]).timestamp()


def _since_start(room: str, now: float) -> int:
    """Seconds since this room's first line in the file (0 for the first)."""
    file = path()
    earlier = [e for e in read(file) if e.get("room") == room] if file.exists() else []
    return round(now - seconds(earlier[0])) if earlier else 0


def record(event: str, room: str, lab: str | None = None, exercise: str | None = None,
           key: str | None = None) -> None:
    """Append one line to the progress file when recording is on; else do nothing."""
    if not enabled() or not room:
        return
    now = _now()
    at = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
    stamp = at.isoformat(timespec="seconds").replace("+00:00", "Z")
    entry = {"v": VERSION, "at": stamp,
             "room": room, "lab": lab, "exercise": exercise, "key": key,
             "event": event, "since_start_s": _since_start(room, now)}
    line = json.dumps({k: v for k, v in entry.items() if v is not None})
    # One short write per line, appended: two kernels' lines interleave, whole.
    with open(path(), "a", encoding="utf-8") as out:
        out.write(line + "\n")


def opened(room: str | None, lab: str | None = None) -> None:
    """Note that a lab's setup cell ran (``labkit.begin``): say once that recording is
    on and where, and record ``begin``."""
    if enabled():
        _announce()
        record("begin", room, lab)
