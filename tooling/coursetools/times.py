"""How long a lab takes, computed rather than guessed, and written into its header.

Taught in: nowhere (instructor tooling; INSTRUCTORS.md quotes the figures). A lab's
time is three measured parts:

- reading: the markdown words of its core path (everything before the
  ``## Appendix`` heading) at 200 words per minute;
- exercises: the sum of the estimates in its exercise headings, ``(≈ N min)``;
- compute: the seconds the whole solution notebook takes in full mode, measured by
  ``labkit measure-labs`` (it runs each notebook and stores the figure, the machine
  and the date in ``metadata.labkit.measured``).

``labkit build-labs`` rewrites the header's ``**Time:**`` sentence from these, so the
stated time can never drift from the text; the appendix is counted apart, as
self-study reading.
"""

import datetime
import math
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import nbformat

from coursetools.notebooks import replace_block

__all__ = ["WORDS_PER_MINUTE", "APPENDIX", "TRACKS", "word_counts", "exercise_minutes",
           "minutes", "time_sentence", "apply_header", "instructors_text", "measure",
           "machine"]

WORDS_PER_MINUTE = 200
APPENDIX = "## Appendix"
_ESTIMATE = re.compile(r"^#+\s*Exercise\s+\d+\.\d+.*\(≈\s*(\d+)\s*min\)", re.MULTILINE)
_TIME = re.compile(r"\*\*Time:\*\*.*?(?=\s*\*\*Hardware:\*\*)", re.DOTALL)
# INSTRUCTORS.md's tracks: which labs each one teaches (core paths; self-study adds
# every appendix). The prose about each track is in INSTRUCTORS.md itself.
ALL_LABS = [f"{n:02d}" for n in range(10)]
TRACKS = {"1-day workshop": ["00", "01", "02", "03", "05", "07"],
          "2-day workshop": ALL_LABS, "5-day course": ALL_LABS, "self-study": ALL_LABS}
WITH_APPENDIX = {"5-day course", "self-study"}
LIVE_FACTOR = 1.3   # explanation, questions and breaks, when a lab is taught live
_GPUS = {"1-day workshop": "none needed; 1 per learner shows NCCL",
         "2-day workshop": "none needed; 2 per learner show DDP, pipelines and TP for real",
         "5-day course": "none needed; 2 per learner recommended",
         "self-study": "none needed"}


def _split(nb) -> tuple[list, list]:
    """Return the markdown cells of the core path and of the appendix."""
    core, appendix, inside = [], [], False
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        inside = inside or cell.source.lstrip().startswith(APPENDIX)
        (appendix if inside else core).append(cell)
    return core, appendix


def _words(cells) -> int:
    return sum(len(cell.source.split()) for cell in cells)


def word_counts(nb) -> tuple[int, int]:
    """Return (core words, appendix words) of a notebook's markdown."""
    core, appendix = _split(nb)
    return _words(core), _words(appendix)


def exercise_minutes(nb) -> int:
    """Return the sum of the core path's exercise estimates, in minutes."""
    core, _ = _split(nb)
    return sum(int(m) for cell in core for m in _ESTIMATE.findall(cell.source))


def _minutes(seconds: float) -> int:
    return max(1, math.ceil(seconds / 60))


def minutes(nb) -> dict:
    """Return a lab's reading, exercises, compute (None: not measured), total and
    appendix minutes."""
    core, appendix = word_counts(nb)
    measured = nb.metadata.get("labkit", {}).get("measured")
    parts = {"reading": math.ceil(core / WORDS_PER_MINUTE),
             "exercises": exercise_minutes(nb),
             "compute": _minutes(measured["full_mode_s"]) if measured else None,
             "appendix": math.ceil(appendix / WORDS_PER_MINUTE)}
    parts["total"] = parts["reading"] + parts["exercises"] + (parts["compute"] or 0)
    return parts


def time_sentence(nb) -> str:
    """Return the header's ``**Time:**`` sentence for a notebook."""
    core, appendix = word_counts(nb)
    reading = math.ceil(core / WORDS_PER_MINUTE)
    exercises = exercise_minutes(nb)
    measured = nb.metadata.get("labkit", {}).get("measured")
    if measured:
        compute = _minutes(measured["full_mode_s"])
        total = f"≈ {reading + exercises + compute} min"
        compute_part = (f"compute {compute} min (full mode, measured on "
                        f"{measured['on']}{_shared(measured)}, {measured['date']}"
                        + (f"; quick mode {measured['quick_mode_s']:.0f} s"
                           if measured.get("quick_mode_s") is not None else "") + ")")
    else:
        total = f"≈ {reading + exercises} min plus compute"
        compute_part = "compute not measured yet (`labkit measure-labs`)"
    extra = math.ceil(appendix / WORDS_PER_MINUTE)
    return (f"**Time:** {total}: reading {reading} min ({core:,} words at "
            f"{WORDS_PER_MINUTE} words/min), exercises {exercises} min (their "
            f"estimates), {compute_part}."
            + (f" The appendix adds about {extra} min of reading for self-study."
               if appendix else ""))


def _shared(measured: dict) -> str:
    """Say so when the machine was busy with other work during the measurement."""
    load, cores = measured.get("load"), measured.get("cores")
    if load is None or cores is None or load <= cores + 0.5:
        return ""
    return f" while shared with other work (load {load:.0f})"


def apply_header(nb) -> bool:
    """Rewrite the first cell's ``**Time:**`` sentence (up to ``**Hardware:**``);
    return whether the notebook has one (every lab does: tests/test_course.py)."""
    if not nb.cells or not _TIME.search(nb.cells[0].source):
        return False
    sentence = time_sentence(nb)
    nb.cells[0].source = _TIME.sub(lambda _: sentence, nb.cells[0].source, count=1)
    return True


def instructors_text(text: str, notebooks: dict) -> str:
    """Return INSTRUCTORS.md with its lab-times table and track totals filled in.

    ``notebooks`` maps each solution's file name to the notebook.
    """
    rows, by_lab = [], {}
    for name, nb in sorted(notebooks.items()):
        m = minutes(nb)
        by_lab[name[:2]] = m
        core, appendix = word_counts(nb)
        measured = nb.metadata.get("labkit", {}).get("measured") or {}
        compute = (f"{m['compute']} ({measured['full_mode_s']:.0f} s full"
                   + (f", {measured['quick_mode_s']:.0f} s quick"
                      if measured.get("quick_mode_s") is not None else "")
                   + f"{_shared(measured)})" if measured else "not measured")
        title = nb.cells[0].source.splitlines()[0].lstrip("# ").strip()
        rows.append(f"| {title} | {m['reading']} ({core:,} words) | {m['exercises']} | "
                    f"{compute} | **{m['total']}** | {m['appendix']} ({appendix:,} words) |")
    on = {nb.metadata.get("labkit", {}).get("measured", {}).get("on") for nb in
          notebooks.values()} - {None}
    table = ("| lab | reading (min) | exercises (min) | compute (min) | total (min) | "
             "appendix (min) |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
             + (f"\nCompute measured on {', '.join(sorted(on))}.\n" if on else ""))
    tracks = ["| track | labs | learner time (min) | taught live (h) | GPUs |",
              "|---|---|---|---|---|"]
    for track, labs in TRACKS.items():
        total = sum(by_lab[lab]["total"] + (by_lab[lab]["appendix"]
                                             if track in WITH_APPENDIX else 0)
                    for lab in labs if lab in by_lab)
        what = ", ".join(labs) + (" with appendices" if track in WITH_APPENDIX else "")
        live = "—" if track == "self-study" else f"{total * LIVE_FACTOR / 60:.1f}"
        tracks.append(f"| {track} | {what} | {total} | {live} | {_GPUS[track]} |")
    text = replace_block(text, "lab-times", table, "INSTRUCTORS.md")
    return replace_block(text, "tracks", "\n".join(tracks) + "\n", "INSTRUCTORS.md")


def machine() -> dict:
    """Describe this machine as a measurement records it: where (cores or GPUs), the
    CPU model and the torch version."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in
                 Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = torch.cuda.device_count()
    where = (f"{gpus} × {torch.cuda.get_device_name(0)}" if gpus
             else f"{cores} CPU cores")
    return {"on": where, "cpu": cpu, "cores": cores,
            "torch": torch.__version__.split("+")[0]}


def _run_seconds(path: Path, quick: bool, timeout: float) -> float:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    saved = os.environ.get("LABKIT_QUICK")
    os.environ["LABKIT_QUICK"] = "1" if quick else "0"
    try:
        with tempfile.TemporaryDirectory(prefix="labkit-measure-") as folder:
            start = time.perf_counter()
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": folder}}).execute()
            return time.perf_counter() - start
    finally:
        if saved is None:
            os.environ.pop("LABKIT_QUICK", None)
        else:
            os.environ["LABKIT_QUICK"] = saved


def measure(path, timeout: float = 3600, quick: bool = False) -> dict:
    """Run a solution notebook in full mode (and in quick mode when asked); store and
    return the seconds, with the machine and its mean load while it ran (a busy
    machine is said to be busy in the header)."""
    path = Path(path)
    before = os.getloadavg()[0]
    full = _run_seconds(path, quick=False, timeout=timeout)
    load = (before + os.getloadavg()[0]) / 2
    quick_s = round(_run_seconds(path, quick=True, timeout=timeout), 1) if quick else None
    measured = {"full_mode_s": round(full, 1), "quick_mode_s": quick_s,
                "load": round(load, 1), **machine(),
                "date": datetime.date.today().isoformat()}
    nb = nbformat.read(path, as_version=4)
    nb.metadata.setdefault("labkit", {})["measured"] = measured
    nbformat.write(nb, path)
    return measured
