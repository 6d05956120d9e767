"""Tests for coursetools.times (the time model and its stated inputs),
coursetools.tracks (prerequisites, primers, schedules) and coursetools.gpus (what a
room needs)."""

import dataclasses
from pathlib import Path

import nbformat
import pytest

from coursetools import gpus, times, tracks
from coursetools.notebooks import BEGIN, END, CourseError

ROOT = Path(__file__).resolve().parents[2]
MEASURED = {"full_mode_s": 130.0, "quick_mode_s": 9.0, "on": "2 CPU cores",
            "date": "2026-12-01"}


def _lab(number="99", words=280, prerequisites=(), header_labs="", gpus_per_learner=0):
    """A solution: header, prose with two Predict questions, given code (a module of 8
    lines, a cell of 3), a guess, an exercise and its check, and an appendix."""
    nb = nbformat.v4.new_notebook()
    module = "%%writefile given.py\n" + "\n".join(f"x{i} = {i}" for i in range(8))
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            f"# Lab {number} — T\n**Prerequisites:** {header_labs or 'none'}. "
            "**Time:** old. **Hardware:** any"),
        nbformat.v4.new_markdown_cell(
            "word " * words + "\n**Predict.** How fast?\n**Predict.** How much?\n"
            "### Exercise 9.1 — x (≈ 7 min)"),
        nbformat.v4.new_code_cell("import torch\n\nprint(1)\n# why"),
        nbformat.v4.new_code_cell(module),
        nbformat.v4.new_code_cell("my_guess = ...   # your guess"),
        nbformat.v4.new_code_cell(f"def f():\n    {BEGIN}\n    return 1\n    {END}"),
        nbformat.v4.new_code_cell("checks.f(f)"),
        nbformat.v4.new_markdown_cell("## Appendix — for self-study\n" + "w " * 250),
        nbformat.v4.new_code_cell("print('appendix code is not counted')")]
    nb.metadata["labkit"] = {"measured": dict(MEASURED),
                             "prerequisites": [dict(p) for p in prerequisites],
                             "gpus_per_learner": gpus_per_learner,
                             "gpus_why": "2 ranks"}
    return nb


def test_the_model_counts_words_code_predictions_and_exercises():
    """Are reading, given code (modules apart from cells), Predict questions and the
    exercise estimates counted from the core path only, exercises and guesses apart?"""
    nb = _lab()
    assert times.code_lines(nb) == (8, 3)      # the module's 8, the cell's 3 non-blank
    assert times.predict_count(nb) == 2 and times.exercise_minutes(nb) == 7
    core, appendix = times.word_counts(nb)
    assert appendix == 5 + 250
    m = times.minutes(nb)
    assert m["reading"] == -(-core // times.WORDS_PER_MINUTE)
    assert m["code"] == 2                      # 8/8 + 3/30 minutes, rounded up
    assert (m["predict"], m["exercises"], m["compute"]) == (2, 7, 3)
    assert m["estimate"] == m["total"] == m["reading"] + 2 + 2 + 7 + 3


def test_the_time_sentence_states_every_input_and_what_is_estimated():
    """Does the header's Time sentence give each part with its count and rate, and say
    which parts are measured and which are estimates? Is it stable when rebuilt?"""
    nb = _lab()
    assert times.apply_header(nb)
    header = nb.cells[0].source
    m = times.minutes(nb)
    assert (f"**Time:** ≈ {m['estimate']} min, an estimate: reading {m['reading']} "
            "min") in header
    assert "words at 140 words/min" in header
    assert ("given code 2 min (8 lines of modules at 8 lines/min, 3 lines in cells at "
            "30 lines/min)") in header
    assert "Predict 2 min (2 questions, 1 min each)" in header
    assert "exercises 7 min (the headings' estimates)" in header
    assert "compute 3 min (full mode, measured on 2 CPU cores, 2026-12-01" in header
    assert "the rates and the exercise minutes are estimates" in header
    assert header.endswith("The appendix adds about 2 min of reading for self-study. "
                           "**Hardware:** any")
    once = nb.cells[0].source
    times.apply_header(nb)
    assert nb.cells[0].source == once          # its own words are not counted


def test_a_rooms_figure_replaces_the_estimate_and_says_so():
    """With a room's median from enough learners, does the header state it as measured,
    with the range, beside the model's estimate; with too few, keep the estimate?"""
    nb = _lab()
    estimate = times.minutes(nb)["estimate"]
    nb.metadata["labkit"]["room"] = {"learners": 4, "minutes": 22.5, "range": [18, 30],
                                     "date": "2026-12-03"}
    assert times.minutes(nb)["total"] == 23
    sentence = times.time_sentence(nb)
    assert sentence.startswith(
        "**Time:** ≈ 23 min, measured in a room: the median of 4 learners from the "
        "setup cell to the last check (18–30 min, 2026-12-03); the model's estimate "
        f"was {estimate} min.")
    nb.metadata["labkit"]["room"]["learners"] = times.ROOM_MIN_LEARNERS - 1
    assert times.minutes(nb)["total"] == estimate
    assert "an estimate" in times.time_sentence(nb)


def test_the_instructors_table_carries_the_stated_inputs():
    """Does INSTRUCTORS.md's lab table show each input (counts beside minutes), the
    estimate, the room's column and where compute was measured?"""
    text = "<!-- lab-times -->\nold\n<!-- /lab-times -->\n"
    out = times.instructors_text(text, {"99_a.ipynb": _lab()})
    row = next(line for line in out.splitlines() if line.startswith("| Lab 99"))
    m = times.minutes(_lab())
    assert row.startswith(f"| Lab 99 — T | {m['reading']} (")
    assert (f"| 2 (8 + 3 lines) | 2 (2) | 7 | 3 (130 s, 9 s quick) | "
            f"**{m['estimate']}** | — | 2 (255 w) |") in row
    assert "Compute measured on 2 CPU cores." in out and "old" not in out
    with pytest.raises(ValueError, match="lab-times"):
        times.instructors_text("no markers", {"99_a.ipynb": _lab()})


# ------------------------------------------------------------------------- tracks

NEEDS_04 = {"lab": "04", "skills": list(tracks.PRIMERS["send_recv"].skills)}
RANKS = {"lab": "03", "skills": ["launching ranks"]}
LABS = {"03_a.ipynb": _lab("03"),
        "04_b.ipynb": _lab("04", header_labs="lab 03", prerequisites=[RANKS]),
        "05_c.ipynb": _lab("05", header_labs="lab 04", prerequisites=[NEEDS_04],
                           gpus_per_learner=2)}


def test_the_courses_tracks_hold():
    """Does every track of the course teach each lab after what it needs, and end each
    day by 17:00 under the labs' times?"""
    notebooks = {p.name: nbformat.read(p, as_version=4)
                 for p in sorted((ROOT / "solutions").glob("*.ipynb"))}
    assert tracks.problems(tracks.TRACKS, notebooks) == []


def test_a_track_that_leaves_out_a_prerequisite_is_refused():
    """Is a track refused when it teaches lab 05 without lab 04 and without the primer,
    naming the lab, what it needs and the ways out; and accepted with the primer?"""
    broken = {"t": [[tracks.lab("03"), tracks.lab("05")]]}
    found = tracks.problems(broken, LABS)
    assert len(found) == 1 and found[0].startswith(
        "t: lab 05 needs lab 04 (send/recv at the cut; requires_grad_()")
    assert "primer" in found[0]
    with pytest.raises(CourseError, match="lab 05 needs lab 04"):
        tracks.instructors_text("", LABS, broken)
    primed = {"t": [[tracks.lab("03"), tracks.primer("send_recv"), tracks.lab("05")]]}
    shown = {"t": [[tracks.lab("03"), tracks.demo("04", minutes=20), tracks.lab("05")]]}
    assert tracks.problems(primed, LABS) == [] and tracks.problems(shown, LABS) == []


def test_a_primer_covers_only_the_skills_it_names():
    """Is a primer that does not cover every skill a lab needs from the left-out lab
    refused, as is one placed after the lab?"""
    more = dict(NEEDS_04, skills=NEEDS_04["skills"] + ["the latency of a split"])
    labs = dict(LABS, **{"05_c.ipynb": _lab("05", header_labs="lab 04",
                                             prerequisites=[more])})
    primed = {"t": [[tracks.lab("03"), tracks.primer("send_recv"), tracks.lab("05")]]}
    assert "the latency of a split" in tracks.problems(primed, labs)[0]
    late = {"t": [[tracks.lab("03"), tracks.lab("05"), tracks.primer("send_recv")]]}
    assert tracks.problems(late, LABS)[0].startswith("t: lab 05 needs lab 04")


def test_a_day_that_overruns_and_a_lab_without_declarations_are_refused():
    """Is a day that ends after 17:00 refused with its end time, and a lab whose
    prerequisites are undeclared, or differ from its header, named?"""
    long_day = {"t": [[tracks.demo("03", minutes=400), tracks.LUNCH, tracks.lab("04")]]}
    found = tracks.problems(long_day, LABS)
    assert found and found[0].startswith("t: day 1 ends at ")
    assert "after 17:00" in found[0]
    undeclared = _lab("06")
    del undeclared.metadata["labkit"]["prerequisites"]
    wrong = _lab("07", header_labs="labs 03 and 05",
                 prerequisites=[{"lab": "03", "skills": ["x"]}])
    found = tracks.declared_problems({"06_d.ipynb": undeclared, "07_e.ipynb": wrong})
    assert found[0].startswith("06_d.ipynb: metadata.labkit.prerequisites is missing")
    assert found[1] == ("07_e.ipynb: its header's Prerequisites name labs ['03', "
                        "'05'], its metadata ['03']")


def test_schedules_and_gpu_needs_are_written_into_instructors():
    """Does INSTRUCTORS.md get each track's row, its day's schedule with the clock
    times, and the GPUs one learner needs (NCCL: one GPU per rank)?"""
    track = {"t": [[tracks.lab("03"), tracks.BREAK, tracks.primer("send_recv"),
                    tracks.lab("05")]]}
    text = "".join(f"<!-- {tag} -->\n<!-- /{tag} -->\n"
                   for tag in ("tracks", "schedules", "gpus"))
    out = tracks.instructors_text(text, LABS, track)
    lab = times.minutes(LABS["03_a.ipynb"])["total"] + tracks.EXPLAIN_MINUTES
    assert f"| 9:00 | lab 03: T ({lab - 10} + 10 explanation) | {lab} |" in out
    assert f"| {tracks._clock(540 + lab)} | break | 15 |" in out
    assert "primer standing for lab 04: `book/primers/send_recv.md`" in out
    assert "To see NCCL in every multi-rank cell: 2 for 05. With 1 GPU, no NCCL" in out
    assert "| 05 | 2 | 2 ranks |" in out


def test_gpu_advice_groups_the_labs_by_the_gpus_they_need():
    """Are the labs grouped by GPUs per learner, and a track of 1-GPU labs told so?"""
    labs = {f"{n}_x.ipynb": _lab(n, gpus_per_learner=g)
            for n, g in (("02", 3), ("03", 2), ("07", 4), ("09", 2), ("01", 1))}
    assert gpus.advice(["02", "03", "07", "09"], labs).endswith(
        "2 for 03, 09; 3 for 02; 4 for 07. With 1 GPU, no NCCL at all (one GPU per "
        "rank)")
    assert gpus.advice(["01"], labs).startswith("none needed; 1 runs every cell")


def test_the_send_recv_primer_covers_what_it_claims():
    """Does the primer page name each skill it stands for (the APIs lab 05 needs)?"""
    primer = tracks.PRIMERS["send_recv"]
    page = (ROOT / primer.page).read_text()
    for api in ("dist.send", "dist.recv", "requires_grad_()", "out.backward(grad)"):
        assert api in page
    assert (ROOT / "book" / "zh_CN" / "primers" / Path(primer.page).name).exists()
    assert dataclasses.is_dataclass(primer) and primer.lab == "04"
