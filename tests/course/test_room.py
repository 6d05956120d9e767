"""A simulated room: five learners, each in their own folder and process, run lab 00's
real checks (a stub, wrong answers, the solution or the reference) on scripted clocks,
and `labkit room gather` turns their progress files into the room's table."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from coursetools import cli, room, times

ROOT = Path(__file__).resolve().parents[2]
LAB = "00_environment_and_hardware.ipynb"

# Each learner: (minute after the setup cell, exercise, what they run). "stub" and
# "wrong" fail, "right" passes, "reference" takes labkit's and then passes on it.
PLANS = {
    "a": [(1, "0.1", "stub"), (4, "0.1", "right"), (10, "0.2", "right"),
          (15, "0.3", "wrong"), (20, "0.3", "right")],
    "b": [(3, "0.1", "right"), (6, "0.2", "wrong"), (8, "0.2", "wrong"),
          (14, "0.2", "right"), (18, "0.3", "right")],
    "c": [(2, "0.1", "stub"), (3, "0.1", "wrong"), (6, "0.1", "right"),
          (11, "0.2", "reference"), (25, "0.3", "right")],
    "d": [(2, "0.1", "right"), (7, "0.2", "right"), (9, "0.3", "stub"),
          (30, "0.3", "reference")],
    "e": [(5, "0.1", "stub"), (9, "0.1", "right")],          # stops after 0.1
}

LEARNER = textwrap.dedent('''
    import json, sys
    import labkit
    from labkit import progress
    from labkit.checks import ExerciseFailed
    from labkit.checks._reference import exercise_for
    from labkit.labs.environment import checks

    clock = {"minute": 0}
    progress._now = lambda: 1_700_000_000 + 60 * clock["minute"]   # scripted
    CHECKS = {"0.1": ("count_parameters", checks.count_parameters),
              "0.2": ("training_memory_bytes", checks.training_memory),
              "0.3": ("allreduce_seconds", checks.allreduce_time)}

    def stub(*args):
        raise NotImplementedError()

    def wrong(*args):
        return 3

    setup = labkit.begin()
    for minute, exercise, action in json.loads(sys.argv[1]):
        clock["minute"] = minute
        key, check = CHECKS[exercise]
        if action == "reference":
            checks.use_reference(key)      # defines `key` here, as in a notebook
            fn = globals()[key]
        elif action == "right":
            namespace = {}
            exec(exercise_for(key=key)["source"], namespace)   # a correct solution
            fn = namespace[key]
        else:
            fn = {"stub": stub, "wrong": wrong}[action]
        try:
            check(fn)
        except ExerciseFailed:
            pass
''')


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Run the five learners at once, each in a folder of its own, recording on."""
    base = tmp_path_factory.mktemp("room")
    script = base / "learner.py"
    script.write_text(LEARNER)
    env = {**os.environ, "LABKIT_RECORD": "1", "LABKIT_LANG": "en",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tooling"),
                                          os.environ.get("PYTHONPATH", "")])}
    running = {}
    for name, plan in PLANS.items():
        (base / name).mkdir()
        running[name] = subprocess.Popen(
            [sys.executable, str(script), json.dumps(plan)], cwd=base / name, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, learner in running.items():
        out, _ = learner.communicate(timeout=300)
        assert learner.returncode == 0, f"learner {name}:\n{out}"
    return base


def _row(rows, **match):
    return next(r for r in rows if all(r[k] == v for k, v in match.items()))


def test_each_learner_leaves_one_readable_file(folders):
    """Does every learner's folder hold one progress file, a line per event, with the
    checks' real verdicts?"""
    files = room.find_files([folders])
    assert sorted(f.parent.name for f in files) == sorted(PLANS)
    events = [e["event"] for e in json.loads("[" + ",".join(
        (folders / "c" / "labkit-progress.jsonl").read_text().splitlines()) + "]")]
    assert events == ["begin", "failed", "failed", "passed", "reference", "passed",
                      "passed"]


def test_the_rooms_table_has_the_medians_and_ranges(folders):
    """Are the learners, finishers, minutes, attempts and references per lab and per
    exercise what the five learners did (worked out by hand from PLANS)?"""
    gathered = room.gather([folders], ROOT / "solutions")
    assert gathered["files"] == 5
    lab = _row(gathered["labs"], notebook=LAB)
    assert (lab["learners"], lab["finished"]) == (5, 4)          # e never finished
    assert lab["minutes"] == {"median": 22.5, "low": 18, "high": 30}   # a b c d
    rows = [r for r in gathered["exercises"] if r["notebook"] == LAB]
    first, second, third = (_row(rows, exercise=x) for x in ("0.1", "0.2", "0.3"))
    assert (first["learners"], first["passed"], first["reference"]) == (5, 5, 0)
    assert first["minutes"] == {"median": 3, "low": 0, "high": 4}
    assert first["attempts"] == {"median": 2, "low": 1, "high": 3}
    assert first["section"] == {"median": 4, "low": 2, "high": 9}
    assert (second["learners"], second["passed"], second["reference"]) == (4, 3, 1)
    assert second["minutes"] == {"median": 0, "low": 0, "high": 8}
    assert second["attempts"] == {"median": 1, "low": 1, "high": 3}
    assert second["section"] == {"median": 6, "low": 5, "high": 11}
    assert (third["learners"], third["passed"], third["reference"]) == (4, 3, 1)
    assert third["minutes"] == {"median": 0, "low": 0, "high": 5}
    assert third["section"] == {"median": 10, "low": 4, "high": 14}   # c: 25 - 11
    assert not [r for r in gathered["labs"] if r["notebook"] != LAB]


def test_the_command_prints_the_table_and_apply_replaces_the_estimate(folders, tmp_path,
                                                                      capsys):
    """Does `labkit room gather` print the table, and does --apply's figure replace the
    model's estimate in the lab's Time sentence?"""
    assert cli.main(["room", "gather", str(folders), "--solutions",
                     str(ROOT / "solutions")]) == 0
    out = capsys.readouterr().out
    assert "| 00_environment_and_hardware | 5 | 4 | 22.5 (18.0–30.0) |" in out
    assert "| 0.2 | 4 | 3 | 0.0 (0.0–8.0) | 6.0 (5.0–11.0) | 1 (1–3) | 1 |" in out
    (tmp_path / "solutions").mkdir()
    copy = tmp_path / "solutions" / LAB
    copy.write_text((ROOT / "solutions" / LAB).read_text())
    written = room.apply(room.gather([folders], tmp_path / "solutions"),
                         tmp_path / "solutions", date="2026-12-03")
    assert written == [copy]
    nb = nbformat.read(copy, as_version=4)
    assert nb.metadata["labkit"]["room"] == {"learners": 4, "minutes": 22.5,
                                             "range": [18, 30], "date": "2026-12-03"}
    estimate = times.minutes(nb)["estimate"]
    assert times.time_sentence(nb).startswith(
        "**Time:** ≈ 23 min, measured in a room: the median of 4 learners from the "
        "setup cell to the last check (18–30 min, 2026-12-03); the model's estimate "
        f"was {estimate} min.")


def test_gather_without_records_says_what_to_do(tmp_path, capsys):
    """Does gathering a folder with no progress file end in a clear error, and a path
    that does not exist name it?"""
    assert cli.main(["room", "gather", str(tmp_path)]) == 2
    assert "did the room record (LABKIT_RECORD=1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no such file or folder"):
        room.find_files([tmp_path / "missing"])
