"""A room's own times: the learners' progress files, gathered into one table.

Taught in: nowhere (instructor tooling: ``labkit room gather``; INSTRUCTORS.md,
"Measure your own room"). Each learner who records (``labkit.progress``) leaves a
``labkit-progress.jsonl`` next to their notebooks; one file is one learner. Given
files or folders (an export, or nbgrader's ``submitted/``, where every submission
carries its folder's files), ``gather`` reads them all and returns, per lab, how long
the learners who finished it took from its setup cell to its last check, and per
exercise how long from the first check to the pass, in how many attempts, and how many
took the reference instead: medians and ranges. ``apply`` stores each lab's figure in
its solution's ``metadata.labkit.room``, which ``coursetools.times`` then states in
place of the model's estimate.
"""

import datetime
import statistics
from pathlib import Path

import nbformat

from coursetools.build import room_of
from coursetools.notebooks import exercises, render
from labkit import progress

__all__ = ["find_files", "gather", "table", "apply"]

_VERDICTS = ("failed", "passed")


def find_files(paths) -> list[Path]:
    """Return the progress files among ``paths`` (files, or folders searched down)."""
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(path.rglob(progress.FILE_NAME.replace(".", "*.", 1)))
        elif path.is_file():
            found.append(path)
        else:
            raise ValueError(f"{path}: no such file or folder")
    return found


def _labs(solutions) -> dict:
    """room -> (notebook name, [exercise numbers]) for every solution notebook."""
    labs = {}
    for path in sorted(Path(solutions).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        numbers = [ex["title"].split()[1] for ex in exercises(nb, path.name)]
        labs[room_of(nb)] = (path.name, numbers)
    return labs


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "low": min(values),
            "high": max(values)}


def _one_exercise(events: list[dict], number: str, start: float) -> dict | None:
    """One learner's exercise: when it was settled, and how, from their records."""
    mine = [e for e in events if e.get("exercise") == number]
    if not mine:
        return None
    verdicts = [e for e in mine if e["event"] in _VERDICTS]
    passes = [e for e in verdicts if e["event"] == "passed"]
    taken = [e for e in mine if e["event"] == "reference"]
    first_pass = progress.seconds(passes[0]) if passes else None
    reference = progress.seconds(taken[0]) if taken else None
    own = first_pass is not None and (reference is None or first_pass < reference)
    result = {"reference": reference is not None and not own,
              "settled": first_pass if own else reference}
    if own:
        first = progress.seconds(verdicts[0])
        before = [progress.seconds(e) for e in events
                  if e.get("exercise") != number and progress.seconds(e) < first]
        result.update(minutes=(first_pass - first) / 60,
                      section=(first_pass - max(before, default=start)) / 60,
                      attempts=verdicts.index(passes[0]) + 1)
    return result


def gather(paths, solutions="solutions") -> dict:
    """Read every progress file under ``paths``; return {"labs": [...], "exercises":
    [...]}, one row each with its learners, medians and ranges (minutes)."""
    labs, files = _labs(solutions), find_files(paths)
    lab_rows, exercise_rows = [], []
    for room, (notebook, numbers) in labs.items():
        per_learner = []
        for file in files:
            events = sorted((e for e in progress.read(file) if e.get("room") == room),
                            key=progress.seconds)
            if events:
                start = progress.seconds(events[0])
                per_learner.append((start, {n: _one_exercise(events, n, start)
                                            for n in numbers}))
        if not per_learner:
            continue
        spans = [max(x["settled"] for x in done.values()) - start
                 for start, done in per_learner
                 if all(x and x["settled"] is not None for x in done.values())]
        lab_rows.append({"room": room, "notebook": notebook,
                         "learners": len(per_learner), "finished": len(spans),
                         "minutes": _spread([s / 60 for s in spans])})
        for number in numbers:
            seen = [done[number] for _, done in per_learner if done[number]]
            own = [x for x in seen if "minutes" in x]
            exercise_rows.append({
                "exercise": number, "notebook": notebook, "learners": len(seen),
                "passed": len(own), "reference": sum(x["reference"] for x in seen),
                **{key: _spread([x[key] for x in own])
                   for key in ("minutes", "section", "attempts")}})
    return {"labs": lab_rows, "exercises": exercise_rows, "files": len(files)}


def _show(spread: dict | None, digits: int = 0) -> str:
    if spread is None:
        return "—"
    f = f"{{:.{digits}f}}"
    return (f"{f.format(spread['median'])} ({f.format(spread['low'])}–"
            f"{f.format(spread['high'])})")


def table(gathered: dict) -> str:
    """The room's figures as markdown: one table of labs, one of exercises."""
    lines = [f"{gathered['files']} progress file(s), one per learner and folder.", "",
             "| lab | learners | finished | minutes, setup cell to last check: "
             "median (range) |", "|---|---|---|---|"]
    lines += [f"| {row['notebook'][:-6]} | {row['learners']} | {row['finished']} | "
              f"{_show(row['minutes'], 1)} |" for row in gathered["labs"]]
    lines += ["", "| exercise | learners | passed on their own | minutes, first check "
              "to pass | minutes, previous check to pass | attempts | took the "
              "reference |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {row['exercise']} | {row['learners']} | {row['passed']} | "
              f"{_show(row['minutes'], 1)} | {_show(row['section'], 1)} | "
              f"{_show(row['attempts'])} | {row['reference']} |"
              for row in gathered["exercises"]]
    return "\n".join(lines) + "\n"


def apply(gathered: dict, solutions="solutions", date: str | None = None) -> list[Path]:
    """Store each finished lab's figure in its solution's ``metadata.labkit.room``;
    return the notebooks written (``labkit build-labs`` then states them)."""
    written = []
    for row in gathered["labs"]:
        if not row["finished"]:
            continue
        path = Path(solutions) / row["notebook"]
        nb = nbformat.read(path, as_version=4)
        spread = row["minutes"]
        nb.metadata.setdefault("labkit", {})["room"] = {
            "learners": row["finished"], "minutes": round(spread["median"], 1),
            "range": [round(spread["low"], 1), round(spread["high"], 1)],
            "date": date or datetime.date.today().isoformat()}
        path.write_text(render(nb))
        written.append(path)
    return written
