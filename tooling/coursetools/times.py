"""How long a lab takes: a model whose every input is stated, written into its header.

Taught in: nowhere (instructor tooling; INSTRUCTORS.md quotes the figures). A lab's
time is the sum of six parts of its core path (everything before ``## Appendix``):

- reading: its markdown words at ``WORDS_PER_MINUTE`` (dense technical prose read to
  learn it, not skimmed);
- given code: the lines the learner reads but does not write, counted in the learner's
  notebook: ``%%writefile`` modules at ``MODULE_LINES_PER_MINUTE`` (programs read to
  be understood), other code cells at ``CELL_LINES_PER_MINUTE`` (read to know what a
  cell runs); exercise cells, their checks and the Predict guesses are not counted;
- Predict: ``PREDICT_MINUTES`` per ``**Predict`` question (its words are in reading);
- exercises: the estimates in the exercise headings, ``(≈ N min)``;
- compute: the seconds the solution takes in full mode, measured by ``labkit
  measure-labs`` (``coursetools.measure``) into ``metadata.labkit.measured``.

The counts and the compute are measured; the rates and the exercise minutes are
estimates, and the header says so. A room replaces them with its own figure: ``labkit
room gather --apply`` (``coursetools.room``) stores the median time its learners took
in ``metadata.labkit.room``, and the header and INSTRUCTORS.md then state that.
``labkit build-labs`` rewrites each header's ``**Time:**`` sentence, so it never
drifts from the lab.
"""

import math
import re

from coursetools.notebooks import exercises, make_lab, replace_block

__all__ = ["WORDS_PER_MINUTE", "MODULE_LINES_PER_MINUTE", "CELL_LINES_PER_MINUTE",
           "PREDICT_MINUTES", "ROOM_MIN_LEARNERS", "APPENDIX", "word_counts",
           "code_lines", "predict_count", "exercise_minutes", "minutes",
           "time_sentence", "apply_header", "instructors_text", "TABLE"]

WORDS_PER_MINUTE = 140          # the middle of the 130-150 a reviewer measured here
MODULE_LINES_PER_MINUTE = 8     # about the 500 lines/hour of reviewing code carefully
CELL_LINES_PER_MINUTE = 30      # an estimate: most cells are a few calls, then output
PREDICT_MINUTES = 1             # an estimate: think, then write the guess down
ROOM_MIN_LEARNERS = 3           # fewer learners than this: keep the estimate
APPENDIX = "## Appendix"
_ESTIMATE = re.compile(r"^#+\s*Exercise\s+\d+\.\d+.*\(≈\s*(\d+)\s*min\)", re.MULTILINE)
_TIME = re.compile(r"\*\*Time:\*\*.*?(?=\s*\*\*Hardware:\*\*)", re.DOTALL)
_PREDICT = "**Predict"
_GUESS = re.compile(r"^\s*my_guess\w*\s*=")

# The Time sentence's wording; coursetools.i18n holds the other languages' (same keys).
TEXT = {
    "sentence": "**Time:** {total}: {parts}. {honesty}",
    "join": ", ",
    "estimate": "≈ {n} min, an estimate", "estimate_plus": "≈ {n} min plus compute",
    "reading": "reading {n} min ({words} words at {wpm} words/min)",
    "code": "given code {n} min ({what})", "code_join": ", ",
    "modules": "{lines} lines of modules at {rate} lines/min",
    "cells": "{lines} lines in cells at {rate} lines/min",
    "predict": "Predict {n} min ({count} questions, {each} min each)",
    "exercises": "exercises {n} min (the headings' estimates)",
    "measured": "compute {n} min (full mode, measured on {on}{shared}, {date}{quick})",
    "shared": " while shared with other work (load {load:.0f})",
    "quick": "; quick mode {q:.0f} s",
    "unmeasured": "compute not measured yet (`labkit measure-labs`)",
    "honesty": "The counts and the compute are measured; the rates and the exercise "
               "minutes are estimates.",
    "room": "**Time:** ≈ {n} min, measured in a room: the median of {learners} "
            "learners from the setup cell to the last check ({low}–{high} min, "
            "{date}); the model's estimate was {estimate} min.",
    "appendix": " The appendix adds about {n} min of reading for self-study.",
}


def _core(nb) -> list:
    """Return the cells of the core path (before the appendix heading)."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith(APPENDIX):
            return nb.cells[:index]
    return list(nb.cells)


def _markdown(cells) -> list:
    return [cell for cell in cells if cell.cell_type == "markdown"]


def _words(cells) -> int:
    """Count the words of the markdown cells, the Time sentence itself left out."""
    return sum(len(_TIME.sub("", cell.source).split()) for cell in _markdown(cells))


def word_counts(nb) -> tuple[int, int]:
    """Return (core words, appendix words) of a notebook's markdown."""
    core = _core(nb)
    return _words(core), _words(nb.cells[len(core):])


def code_lines(nb) -> tuple[int, int]:
    """Return the non-blank lines of given code in the core path of the learner's
    notebook: (in ``%%writefile`` modules, in other cells)."""
    skip = {i for ex in exercises(nb) for i in (ex["cell"], ex["check_cell"])}
    lab = make_lab(nb)
    modules = cells = 0
    for index, cell in enumerate(_core(lab)):
        if cell.cell_type != "code" or index in skip:
            continue
        lines = [line for line in cell.source.splitlines() if line.strip()]
        code = [line for line in lines if not line.lstrip().startswith("#")]
        if code and all(_GUESS.match(line) for line in code):
            continue                                 # a Predict guess: counted there
        if lines and lines[0].startswith("%%writefile"):
            modules += len(lines) - 1
        else:
            cells += len(lines)
    return modules, cells


def predict_count(nb) -> int:
    """Return the number of Predict questions of the core path."""
    return sum(cell.source.count(_PREDICT) for cell in _markdown(_core(nb)))


def exercise_minutes(nb) -> int:
    """Return the sum of the core path's exercise estimates, in minutes."""
    return sum(int(m) for cell in _markdown(_core(nb)) for m in _ESTIMATE.findall(
        cell.source))


def _up(amount: float) -> int:
    return math.ceil(amount) if amount > 0 else 0


def _nearest(amount: float) -> int:
    return math.floor(amount + 0.5)   # half up: 22.5 min is 23, as a reader expects


def room_figure(nb) -> dict | None:
    """Return the room's measurement of this lab (``labkit room gather --apply``) when
    enough learners finished it, else None."""
    room = nb.metadata.get("labkit", {}).get("room")
    return room if room and room.get("learners", 0) >= ROOM_MIN_LEARNERS else None


def _estimate(parts: dict) -> int:
    """The model's minutes: the sum of its parts (compute None: not measured)."""
    return sum(parts[k] or 0 for k in ("reading", "code", "predict", "exercises",
                                       "compute"))


def minutes(nb) -> dict:
    """Return a lab's parts in minutes (compute None: not measured), the model's
    ``estimate``, the ``total`` (the room's median where it has one) and the
    appendix's reading."""
    core, appendix = word_counts(nb)
    modules, cells = code_lines(nb)
    measured = nb.metadata.get("labkit", {}).get("measured")
    parts = {"reading": _up(core / WORDS_PER_MINUTE),
             "code": _up(modules / MODULE_LINES_PER_MINUTE
                         + cells / CELL_LINES_PER_MINUTE),
             "predict": predict_count(nb) * PREDICT_MINUTES,
             "exercises": exercise_minutes(nb),
             "compute": max(1, _up(measured["full_mode_s"] / 60)) if measured else None,
             "appendix": _up(appendix / WORDS_PER_MINUTE)}
    parts["estimate"] = _estimate(parts)
    room = room_figure(nb)
    parts["total"] = _nearest(room["minutes"]) if room else parts["estimate"]
    return parts


def _shared(measured: dict) -> bool:
    """Tell whether the machine was busy with other work during the measurement."""
    load, cores = measured.get("load"), measured.get("cores")
    return load is not None and cores is not None and load > cores + 0.5


def _compute_part(measured: dict | None, m: dict, text: dict) -> str:
    if not measured:
        return text["unmeasured"]
    quick = measured.get("quick_mode_s")
    on = text.get("machine", str)(measured["on"])   # an edition names it in its words
    return text["measured"].format(
        n=m["compute"], on=on, date=measured["date"],
        shared=(text["shared"].format(load=measured["load"]) if _shared(measured)
                else ""),
        quick=text["quick"].format(q=quick) if quick is not None else "")


def _model_parts(nb, m: dict, text: dict, reading: dict | None) -> list[str]:
    count, rate = ((reading["count"], reading["rate"]) if reading
                   else (word_counts(nb)[0], WORDS_PER_MINUTE))
    modules, cells = code_lines(nb)
    parts = [text["reading"].format(n=m["reading"], words=f"{count:,}", wpm=rate)]
    what = ([text["modules"].format(lines=modules, rate=MODULE_LINES_PER_MINUTE)]
            if modules else []) + ([text["cells"].format(
                lines=cells, rate=CELL_LINES_PER_MINUTE)] if cells else [])
    if what:
        parts.append(text["code"].format(n=m["code"],
                                         what=text["code_join"].join(what)))
    if m["predict"]:
        parts.append(text["predict"].format(n=m["predict"], count=predict_count(nb),
                                            each=PREDICT_MINUTES))
    parts.append(text["exercises"].format(n=m["exercises"]))
    measured = nb.metadata.get("labkit", {}).get("measured")
    return parts + [_compute_part(measured, m, text)]


def time_sentence(nb, text: dict = TEXT, reading: dict | None = None) -> str:
    """Return the header's ``**Time:**`` sentence for a notebook.

    ``text`` is the wording, English unless a translated edition passes its own
    (coursetools.edition_time); ``reading`` replaces the reading part with that
    edition's own (``minutes``, ``appendix``, the ``count`` of its text and the
    ``rate``, in its units): the rest of the model is the same in every edition.
    """
    m = minutes(nb)
    if reading:
        m = _with_reading(m, reading, room_figure(nb))
    room = room_figure(nb)
    if room:
        low, high = room["range"]
        sentence = text["room"].format(n=m["total"], learners=room["learners"],
                                       low=_nearest(low), high=_nearest(high),
                                       date=room["date"], estimate=m["estimate"])
    else:
        measured = nb.metadata.get("labkit", {}).get("measured")
        total = (text["estimate"] if measured else text["estimate_plus"]).format(
            n=m["estimate"])
        sentence = text["sentence"].format(
            total=total, parts=text["join"].join(_model_parts(nb, m, text, reading)),
            honesty=text["honesty"])
    appendix = text["appendix"].format(n=m["appendix"]) if m["appendix"] else ""
    return sentence + appendix


def _with_reading(m: dict, reading: dict, room: dict | None) -> dict:
    """The parts ``m`` with another edition's reading, and its estimate added up again."""
    m = dict(m, reading=reading["minutes"], appendix=reading["appendix"])
    m["estimate"] = _estimate(m)
    if not room:
        m["total"] = m["estimate"]
    return m


def apply_header(nb) -> bool:
    """Rewrite the first cell's ``**Time:**`` sentence (up to ``**Hardware:**``);
    return whether the notebook has one (every lab does: tests/tooling/test_build)."""
    if not nb.cells or not _TIME.search(nb.cells[0].source):
        return False
    sentence = time_sentence(nb)
    nb.cells[0].source = _TIME.sub(lambda _: sentence, nb.cells[0].source, count=1)
    return True


# INSTRUCTORS.md's lab-times table; coursetools.guides holds the other languages'.
TABLE = {
    "header": "| lab | reading (min) | given code (min: module + cell lines) | "
              "Predict (min: questions) | exercises (min, estimates) | compute (min, "
              "measured) | estimate (min) | your room (min) | appendix (min) |",
    "row": "| {title} | {reading} ({words} w) | {code} ({modules} + {cells} lines) | "
           "{predict} ({questions}) | {exercises} | {compute} | **{estimate}** | "
           "{room} | {appendix} ({appendix_words} w) |",
    "compute": "{n} ({full:.0f} s{quick}{load})", "quick": ", {q:.0f} s quick",
    "load": ", load {load:.0f}", "unmeasured": "not measured",
    "room": "**{n}** ({low:.0f}–{high:.0f}, {learners} learners)",
    "on": "\nCompute measured on {on}.\n",
}


def _row(nb, table: dict = TABLE, title: str | None = None) -> str:
    m = minutes(nb)
    core, appendix = word_counts(nb)
    modules, cells = code_lines(nb)
    measured = nb.metadata.get("labkit", {}).get("measured") or {}
    compute = (table["compute"].format(
        n=m["compute"], full=measured["full_mode_s"],
        quick=(table["quick"].format(q=measured["quick_mode_s"])
               if measured.get("quick_mode_s") is not None else ""),
        load=table["load"].format(load=measured["load"]) if _shared(measured) else "")
        if measured else table["unmeasured"])
    room = room_figure(nb)
    in_room = (table["room"].format(n=m["total"], low=room["range"][0],
                                    high=room["range"][1], learners=room["learners"])
               if room else "—")
    title = title or nb.cells[0].source.splitlines()[0].lstrip("# ").strip()
    return table["row"].format(
        title=title, reading=m["reading"], words=f"{core:,}", code=m["code"],
        modules=modules, cells=cells, predict=m["predict"],
        questions=predict_count(nb), exercises=m["exercises"], compute=compute,
        estimate=m["estimate"], room=in_room, appendix=m["appendix"],
        appendix_words=f"{appendix:,}")


def instructors_text(text: str, notebooks: dict, table: dict = TABLE,
                     titles: dict | None = None, machine=str) -> str:
    """Return INSTRUCTORS.md with its lab-times table filled in.

    ``notebooks`` maps each solution's file name to the notebook; another language's
    guide (coursetools.guides) passes its ``table`` wording, its labs' ``titles`` (by
    file name) and how it words the ``machine`` a measurement ran on.
    """
    titles = titles or {}
    rows = [_row(nb, table, titles.get(name)) for name, nb in sorted(notebooks.items())]
    on = {nb.metadata.get("labkit", {}).get("measured", {}).get("on") for nb in
          notebooks.values()} - {None}
    block = (table["header"] + "\n" + "|---" * 9 + "|\n" + "\n".join(rows) + "\n"
             + (table["on"].format(on=", ".join(sorted(machine(x) for x in on)))
                if on else ""))
    return replace_block(text, "lab-times", block, "INSTRUCTORS.md")
