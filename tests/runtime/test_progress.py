"""Tests for labkit.progress: a room's records, opt-in, local, one line per verdict."""

import json

import pytest

import labkit
from labkit import progress
from labkit.checks import ExerciseFailed
from labkit.labs.environment import checks


def _right(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _stub(model):
    raise NotImplementedError()


@pytest.fixture
def room(tmp_path, monkeypatch):
    """A learner's folder with recording switched on through the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(progress.ENV, "1")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setitem(progress._state, "announced", False)
    return tmp_path / progress.FILE_NAME


def test_nothing_is_recorded_unless_the_learner_opts_in(tmp_path, monkeypatch):
    """With LABKIT_RECORD unset, does a check leave no file behind?"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(progress.ENV, raising=False)
    checks.count_parameters(_right)
    assert not progress.enabled() and list(tmp_path.iterdir()) == []


def test_each_verdict_and_reference_is_one_line_with_nothing_personal(room, capsys):
    """Does begin say once where the file is, and do a stub, a pass and a reference
    each add one line naming the lab and exercise, with no name, host or code?"""
    labkit.begin()
    labkit.begin()
    said = capsys.readouterr().out
    assert said.count("Recording this room's times") == 1 and str(room) in said
    with pytest.raises(ExerciseFailed):
        checks.count_parameters(_stub)
    checks.count_parameters(_right)
    checks.use_reference("training_memory_bytes")
    lines = [json.loads(line) for line in room.read_text().splitlines()]
    assert [(e["event"], e.get("exercise")) for e in lines] == [
        ("begin", None), ("begin", None), ("failed", "0.1"), ("passed", "0.1"),
        ("reference", "0.2")]
    assert {e["room"] for e in lines} == {"environment"}
    assert {e["lab"] for e in lines} == {"00_environment_and_hardware"}
    assert set(lines[2]) == {"v", "at", "room", "lab", "exercise", "key", "event",
                             "since_start_s"}
    assert progress.read(room) == lines


def test_a_check_that_re_raises_with_more_detail_counts_once(room):
    """Is a failure that a check catches and raises again, with more detail, one
    attempt, while a second run of the check is a second one?"""
    source = ("from labkit.checks import ExerciseFailed\n"
              "def count_parameters(fn):\n"
              "    try:\n"
              "        raise ExerciseFailed('count_parameters: wrong')\n"
              "    except ExerciseFailed as err:\n"
              "        raise ExerciseFailed(f'rank 0: {err}') from None\n")
    module = {"__name__": "labkit.labs.environment.checks"}
    exec(compile(source, "<a room's check>", "exec"), module)
    for _ in range(2):
        with pytest.raises(ExerciseFailed, match="rank 0"):
            module["count_parameters"](_right)
    assert [e["event"] for e in progress.read(room)] == ["failed", "failed"]


def test_ranks_and_started_notebooks(room, monkeypatch, capsys):
    """Does a rank (under torchrun) record nothing, and does progress.start() turn
    recording on without the environment variable, until stop()?"""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    checks.count_parameters(_right)
    assert not room.exists()
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.delenv(progress.ENV)
    progress.start()
    assert "Recording" in capsys.readouterr().out
    checks.count_parameters(_right)
    progress.stop()
    checks.count_parameters(_right)
    assert [e["event"] for e in progress.read(room)] == ["passed"]


def test_since_start_counts_from_the_labs_first_line_and_torn_lines_are_skipped(
        room, monkeypatch):
    """Are the seconds counted from the lab's first line, on the clock, and is a
    torn or foreign line skipped when the file is read?"""
    clock = iter([1000.0, 1090.0])
    monkeypatch.setattr(progress, "_now", lambda: next(clock))
    labkit.begin()
    checks.count_parameters(_right)
    with open(room, "a") as out:
        out.write('{"v": 1, "event": "pass\n[1, 2]\n')
    records = progress.read(room)
    assert [e["since_start_s"] for e in records] == [0, 90]
    assert progress.seconds(records[1]) - progress.seconds(records[0]) == 90
