"""The course's tracks: which labs a day teaches, in what order, and whether it holds.

Taught in: nowhere (instructor tooling; INSTRUCTORS.md shows the tracks and their
schedules). Each lab declares what it needs from earlier labs in
``metadata.labkit.prerequisites`` (``[{"lab": "04", "skills": [...]}]``). A track is
a list of days, each a list of steps: a lab taught, labs demonstrated by the
instructor, a primer (a short page in ``book/primers/`` that stands for the skills
of a lab the track leaves out), breaks, lunch. ``problems`` refuses a track that
teaches a lab before what it needs (neither taught, demonstrated nor primed) and a
day that runs past its end under the labs' times (``coursetools.times``: the room's
own where it measured them); ``labkit build-labs`` fails on any. ``instructors_text``
writes the tracks table and each day's schedule into INSTRUCTORS.md.
"""

import dataclasses
import math
import re
from pathlib import Path

from coursetools import gpus, times
from coursetools.notebooks import CourseError, replace_block

__all__ = ["Step", "Primer", "PRIMERS", "TRACKS", "EXPLAIN_MINUTES", "WORDS",
           "problems", "schedule", "instructors_text"]

ROOT = Path(__file__).resolve().parents[2]
EXPLAIN_MINUTES = 10       # an estimate: the instructor opens and closes each lab
DAY = ("9:00", "17:00")


@dataclasses.dataclass(frozen=True)
class Step:
    """One block of a day: ``kind`` is lab, demo, primer, appendices, break, lunch or
    wrap-up; ``labs`` the labs it is about; ``minutes`` its length where fixed."""
    kind: str
    labs: tuple[str, ...] = ()
    minutes: int = 0
    primer: str = ""


@dataclasses.dataclass(frozen=True)
class Primer:
    """A short page that stands for some skills of a lab a track leaves out."""
    page: str                  # relative to the course folder
    lab: str
    skills: tuple[str, ...]


def lab(number: str) -> Step:
    return Step("lab", (number,))


def demo(*labs: str, minutes: int) -> Step:
    return Step("demo", labs, minutes)


def primer(name: str) -> Step:
    return Step("primer", (PRIMERS[name].lab,), primer=name)


def appendices(*labs: str) -> Step:
    return Step("appendices", labs)


BREAK, LUNCH, WRAP = Step("break", minutes=15), Step("lunch", minutes=60), Step(
    "wrap-up", minutes=15)

PRIMERS = {"send_recv": Primer(
    "book/primers/send_recv.md", "04",
    ("send/recv at the cut", "requires_grad_() on the received activation",
     "out.backward(grad)"))}

# The tracks. The prose about each is in INSTRUCTORS.md; "self-study" is every lab.
TRACKS = {
    "1-day workshop: data parallelism to sharding": [
        [demo("00", "01", minutes=30), lab("02"), BREAK, lab("03"), LUNCH, lab("07"),
         BREAK, WRAP]],
    "1-day workshop: data parallelism to pipelines": [
        [demo("00", "01", minutes=30), lab("02"), BREAK, lab("03"), LUNCH,
         primer("send_recv"), lab("05"), BREAK, WRAP]],
    "2-day workshop": [
        [demo("00", "01", minutes=30), lab("02"), BREAK, lab("03"), LUNCH, lab("04"),
         BREAK, lab("05"), WRAP],
        [demo("06", minutes=30), lab("07"), BREAK, lab("09"), LUNCH, lab("08"), BREAK,
         WRAP]],
    "5-day course": [
        [lab("00"), BREAK, lab("01"), LUNCH, appendices("00", "01"), WRAP],
        [lab("02"), BREAK, lab("03"), LUNCH, appendices("02", "03"), WRAP],
        # lab 09 (it needs only 03) joins day 3, so that 08 joins day 4 and day 5
        # holds lab 10, the capstone (3½ h), which composes 03, 05, 07 and 08
        [lab("04"), BREAK, lab("05"), LUNCH, lab("09"), appendices("04", "05", "09"),
         WRAP],
        [lab("06"), BREAK, lab("07"), LUNCH, lab("08"), appendices("06", "07", "08"),
         WRAP],
        [lab("10"), LUNCH, appendices("10"), WRAP]],
}
SELF_STUDY = "self-study"
_LABS_NAMED = re.compile(r"\b(\d\d)\b")
_PREREQUISITES = re.compile(r"\*\*Prerequisites:\*\*(.*?)(?=\*\*Time:\*\*)", re.DOTALL)


def _clock(minutes: int) -> str:
    return f"{minutes // 60}:{minutes % 60:02d}"


def _at(text: str) -> int:
    hours, mins = text.split(":")
    return int(hours) * 60 + int(mins)


def primer_minutes(name: str, root: Path = ROOT) -> int:
    """A primer's time by the labs' rates: its words and its code lines."""
    text = (root / PRIMERS[name].page).read_text(encoding="utf-8")
    code = re.findall(r"^```.*?^```", text, re.MULTILINE | re.DOTALL)
    lines = sum(len([x for x in block.splitlines()[1:-1] if x.strip()])
                for block in code)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return math.ceil(len(prose.split()) / times.WORDS_PER_MINUTE
                     + lines / times.MODULE_LINES_PER_MINUTE)


def step_minutes(step: Step, by_lab: dict, root: Path = ROOT) -> int:
    """How long a step takes: a lab its time plus the instructor's explanation."""
    if step.kind == "lab":
        return by_lab[step.labs[0]]["total"] + EXPLAIN_MINUTES
    if step.kind == "primer":
        return primer_minutes(step.primer, root)
    if step.kind == "appendices":
        return sum(by_lab[n]["appendix"] for n in step.labs)
    return step.minutes


def schedule(day: list[Step], by_lab: dict, root: Path = ROOT) -> list[tuple]:
    """Return (start, step, minutes) for each step of a day, from 9:00."""
    clock, rows = _at(DAY[0]), []
    for step in day:
        length = step_minutes(step, by_lab, root)
        rows.append((clock, step, length))
        clock += length
    return rows + [(clock, Step("end"), 0)]


def _prerequisites(nb) -> list | None:
    return nb.metadata.get("labkit", {}).get("prerequisites")


def declared_problems(notebooks: dict) -> list[str]:
    """Say which labs declare no prerequisites, or other ones than their header."""
    found = []
    for name, nb in sorted(notebooks.items()):
        wanted = _prerequisites(nb)
        if wanted is None:
            found.append(f"{name}: metadata.labkit.prerequisites is missing (a list of "
                         '{"lab": "NN", "skills": [...]}, empty for none)')
            continue
        header = _PREREQUISITES.search(nb.cells[0].source) if nb.cells else None
        named = set(_LABS_NAMED.findall(header.group(1))) if header else set()
        if named != {p["lab"] for p in wanted}:
            found.append(f"{name}: its header's Prerequisites name labs "
                         f"{sorted(named)}, its metadata "
                         f"{sorted(p['lab'] for p in wanted)}")
    return found


def _covered(step: Step, prerequisite: dict) -> bool:
    if step.kind in ("lab", "demo"):
        return prerequisite["lab"] in step.labs
    if step.kind == "primer":
        known = PRIMERS[step.primer]
        return (known.lab == prerequisite["lab"]
                and set(prerequisite["skills"]) <= set(known.skills))
    return False


def _gaps(track: str, steps: list[Step], notebooks: dict) -> list[str]:
    by_number = {name[:2]: nb for name, nb in notebooks.items()}
    found = []
    for index, step in enumerate(steps):
        if step.kind != "lab":
            continue
        for need in _prerequisites(by_number[step.labs[0]]) or []:
            if not any(_covered(before, need) for before in steps[:index]):
                found.append(
                    f"{track}: lab {step.labs[0]} needs lab {need['lab']} ("
                    f"{'; '.join(need['skills'])}), which the track does not teach "
                    f"before it: teach or demonstrate lab {need['lab']} first, or add "
                    "a primer that covers those skills (coursetools.tracks.PRIMERS)")
    return found


def problems(tracks: dict, notebooks: dict, root: Path = ROOT) -> list[str]:
    """Say what breaks the tracks: a lab that is missing, a prerequisite neither
    taught, demonstrated nor primed before it, a primer page that is not there, a
    day that ends after 17:00."""
    by_lab = {name[:2]: times.minutes(nb) for name, nb in notebooks.items()}
    found = declared_problems(notebooks)
    for track, days in tracks.items():
        steps = [step for day in days for step in day]
        missing = sorted({n for s in steps for n in s.labs} - set(by_lab))
        if missing:
            found.append(f"{track}: no solution notebook for lab(s) "
                         f"{', '.join(missing)}")
            continue
        pages = [PRIMERS[s.primer].page for s in steps if s.kind == "primer"]
        found += [f"{track}: its primer {p} does not exist" for p in pages
                  if not (root / p).exists()]
        if any(not (root / p).exists() for p in pages):
            continue
        found += _gaps(track, steps, notebooks)
        for number, day in enumerate(days, 1):
            end = schedule(day, by_lab, root)[-1][0]
            if end > _at(DAY[1]):
                found.append(f"{track}: day {number} ends at {_clock(end)}, after "
                             f"{DAY[1]}, under the labs' times: move a lab to another "
                             "day, or demonstrate one")
    return found


# INSTRUCTORS.md's tracks table and schedules; coursetools.guides holds the other
# languages' (the same keys; "tracks" names each track in that language).
WORDS = {
    "lab": "lab {labs}: {title} ({minutes} + {explain} explanation)",
    "demo": "lab {labs}, demonstrated (quick mode)",
    "demos": "labs {labs}, demonstrated (quick mode)",
    "primer": "primer standing for lab {labs}: `{page}`",
    "appendices": "the appendices of labs {labs} (reading, questions)",
    "and": " and ", "break": "break", "lunch": "lunch",
    "wrap-up": "wrap-up and questions",
    "day": "Day {n}:", "schedule_header": "| start | what | min |",
    "end": "end ({spare} min before {close})",
    "shown": "; {labs} demonstrated", "primed": "; primer {names}",
    "days": "{n} × {start}–{close}, ends {ends}",
    "header": "| track | labs taught | learner time (min) | days | GPUs per learner |",
    "self-study": "{labs}, with appendices", "at your pace": "at your pace",
    "tracks": {},
}


def _what(step: Step, minutes: int, titles: dict, words: dict = WORDS) -> str:
    labs = words["and"].join(step.labs)
    if step.kind == "lab":
        return words["lab"].format(labs=labs, title=titles[labs],
                                   minutes=minutes - EXPLAIN_MINUTES,
                                   explain=EXPLAIN_MINUTES)
    if step.kind == "demo":
        return words["demos" if len(step.labs) > 1 else "demo"].format(labs=labs)
    if step.kind == "primer":
        return words["primer"].format(labs=labs, page=PRIMERS[step.primer].page)
    if step.kind == "appendices":
        return words["appendices"].format(labs=labs)
    return words.get(step.kind, step.kind)


def _titles(notebooks: dict) -> dict:
    return {name[:2]: nb.cells[0].source.splitlines()[0].split("—", 1)[-1].strip()
            for name, nb in notebooks.items()}


def _taught(track: str, days: list, notebooks: dict, root: Path,
            words: dict = WORDS, titles: dict | None = None) -> list[str]:
    by_lab = {name[:2]: times.minutes(nb) for name, nb in notebooks.items()}
    titles = titles or _titles(notebooks)
    lines = [f"**{words['tracks'].get(track, track)}**", ""]
    for number, day in enumerate(days, 1):
        rows = schedule(day, by_lab, root)
        spare = _at(DAY[1]) - rows[-1][0]
        lines += [words["day"].format(n=number) if len(days) > 1 else "", "",
                  words["schedule_header"], "|---|---|---|"]
        lines += [f"| {_clock(start)} | {_what(step, length, titles, words)} | "
                  f"{length} |" for start, step, length in rows[:-1]]
        end = _clock(rows[-1][0])
        lines += [f"| {end} | {words['end'].format(spare=spare, close=DAY[1])} | |", ""]
    return [line for i, line in enumerate(lines) if line or lines[i - 1]]


def _summary(track: str, days: list, notebooks: dict, root: Path,
             words: dict = WORDS) -> str:
    by_lab = {name[:2]: times.minutes(nb) for name, nb in notebooks.items()}
    steps = [s for day in days for s in day]
    taught = [n for s in steps if s.kind == "lab" for n in s.labs]
    shown = [n for s in steps if s.kind == "demo" for n in s.labs]
    primed = [s.primer for s in steps if s.kind == "primer"]
    learner = sum(step_minutes(s, by_lab, root) - (EXPLAIN_MINUTES if s.kind == "lab"
                                                    else 0)
                  for s in steps if s.kind in ("lab", "demo", "primer", "appendices"))
    ends = ", ".join(_clock(schedule(day, by_lab, root)[-1][0]) for day in days)
    what = (", ".join(taught)
            + (words["shown"].format(labs=", ".join(shown)) if shown else "")
            + (words["primed"].format(names=", ".join(primed)) if primed else ""))
    when = words["days"].format(n=len(days), start=DAY[0], close=DAY[1], ends=ends)
    return (f"| {words['tracks'].get(track, track)} | {what} | {learner} | {when} | "
            f"{gpus.advice(taught, notebooks, words.get('gpus', gpus.ADVICE))} |")


def instructors_text(text: str, notebooks: dict, tracks: dict = TRACKS,
                     root: Path = ROOT, words: dict = WORDS,
                     titles: dict | None = None) -> str:
    """Return INSTRUCTORS.md with its tracks table and schedules filled in; raise
    CourseError when a track does not hold (``problems``). Another language's guide
    (coursetools.guides) passes its ``words`` and its labs' ``titles``."""
    found = problems(tracks, notebooks, root)
    if found:
        raise CourseError("The tracks do not hold:\n- " + "\n- ".join(found))
    by_lab = {name[:2]: times.minutes(nb) for name, nb in notebooks.items()}
    every = sorted(by_lab)
    study = sum(by_lab[n]["total"] + by_lab[n]["appendix"] for n in every)
    advice = words.get("gpus", gpus.ADVICE)
    rows = [words["header"], "|---|---|---|---|---|"]
    rows += [_summary(track, days, notebooks, root, words)
             for track, days in tracks.items()]
    rows.append(f"| {words['tracks'].get(SELF_STUDY, SELF_STUDY)} | "
                f"{words['self-study'].format(labs=', '.join(every))} | {study} | "
                f"{words['at your pace']} | {gpus.advice(every, notebooks, advice)} |")
    plans = [line for track, days in tracks.items()
             for line in _taught(track, days, notebooks, root, words, titles)]
    text = replace_block(text, "tracks", "\n".join(rows) + "\n", "INSTRUCTORS.md")
    text = replace_block(text, "gpus", gpus.table(notebooks, advice), "INSTRUCTORS.md")
    return replace_block(text, "schedules", "\n".join(plans).rstrip() + "\n",
                         "INSTRUCTORS.md")
