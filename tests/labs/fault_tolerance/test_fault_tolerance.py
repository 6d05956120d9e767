"""Lab 09: resume equals the uninterrupted run, a killed rank recovers under torchrun,
a kill during save leaves a loadable snapshot, and each classic mistake gets its hint.

The programs are the solution notebook's own ``%%writefile`` cells
(``tests/notebook_cells.write_program``), written to a temporary folder, with a
deliberate mistake where a test needs one.
"""

import importlib
import re
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from notebook_cells import write_program

from labkit import launch
from labkit.checks import ExerciseFailed
from labkit.labs.fault_tolerance import checks, elastic, snapshots

NOTEBOOK = "09_fault_tolerance.ipynb"
ALTERNATIVES = Path(__file__).resolve().parent / "alternatives"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder on sys.path for the learner's modules (the notebook's, in class)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("snapshot", "elastic_train", "hang_finder", "debug_worker"):
        sys.modules.pop(name, None)
    return tmp_path


def _write(folder, module, replace=()):
    return write_program(folder, NOTEBOOK, module, replace=replace)


# ---------------------------------------------------------------- what the issue asks


def test_resume_equals_the_uninterrupted_run(folder):
    """Stopped at step 12, resumed in new processes: are all weights identical?"""
    result = checks.snapshot_resume(_write(folder, "snapshot.py"))
    full, resumed = result["full"], result["resumed"]
    for rank in range(2):
        assert resumed[rank]["start"] == checks.STOP_AT
        assert full[rank]["weights"].keys() == resumed[rank]["weights"].keys()
        for name, tensor in full[rank]["weights"].items():
            assert torch.equal(tensor, resumed[rank]["weights"][name]), (rank, name)
    assert full[0]["log"][-1]["step"] == checks.QUICK_CFG.steps - 1


def test_killed_rank_under_torchrun_recovers_the_same_weights(folder):
    """Does a SIGKILLed rank under torchrun --max-restarts=3 resume to equal weights?"""
    _write(folder, "snapshot.py")
    summary = checks.elastic_restart(_write(folder, "elastic_train.py"),
                                     folder / "snapshot.py")
    assert summary["restarts"] == 1
    assert summary["resumed_at"] == [checks.KILL_AT, checks.KILL_AT]
    assert summary["killed"]["rank"] == 1
    assert any("exitcode: -9" in line for line in summary["agent_lines"])


def test_timed_restart_runs_the_real_torchrun_and_shows_each_rank(folder):
    """Does the lab's measurement restart under the real torchrun (new Pythons, each
    importing torch), with both ranks' stacks at the kill?"""
    _write(folder, "snapshot.py")
    summary = checks.timed_restart(_write(folder, "elastic_train.py"))
    assert summary["resumed_at"] == [checks.KILL_AT, checks.KILL_AT]
    assert any("exitcode: -9" in line for line in summary["agent_lines"])
    assert len(summary["stacks"]) == 2 and all("elastic_train.py" in s
                                               for s in summary["stacks"])
    # new Pythons running the script, not labkit's forked ranks (runpy's frames)
    assert not any("runpy" in s for s in summary["stacks"])
    assert summary["restart_seconds"] > 0


def test_kill_during_atomic_save_leaves_the_previous_snapshot(folder, tmp_path_factory):
    """Killed half-way through save_atomic, does snapshot.pt load, unchanged?"""
    _write(folder, "snapshot.py")
    snapshot = importlib.import_module("snapshot")   # the module the cell wrote
    report = snapshots.kill_during_save(snapshot.save_atomic,
                                        tmp_path_factory.mktemp("atomic"))
    assert report["stalled"] and report["exitcode"] == -9
    assert 0 < report["written"] < report["total"]
    assert report["writing"] == "snapshot.pt.tmp"
    assert report["loads"] and report["previous_intact"]


def test_kill_during_in_place_save_tears_the_snapshot(tmp_path):
    """Killed half-way through a plain torch.save, is snapshot.pt unreadable?"""
    report = snapshots.kill_during_save(snapshots.save_in_place, tmp_path)
    assert report["stalled"] and report["writing"] == "snapshot.pt"
    assert not report["loads"] and report["error"]


def test_the_course_loop_matches_the_uninterrupted_reference():
    """Does the elastic script's loop, uninterrupted, equal snapshots.reference?"""
    cfg = snapshots.Config(steps=8)
    runs = launch.run(snapshots.reference, 2, args=(cfg,), backend="gloo", timeout=30)
    again = launch.run(snapshots.reference, 2, args=(cfg,), backend="gloo", timeout=30)
    for first, second in zip(runs, again):
        assert all(torch.equal(first["weights"][k], second["weights"][k])
                   for k in first["weights"])
    assert runs[0]["log"][0]["rng"] != runs[1]["log"][0]["rng"], "per-rank RNG streams"


# ---------------------------------------------------------------- exercise 9.1 mistakes

FSYNC_LINE = ("        os.fsync(f.fileno())             "
              "# on the disk before the rename, not in a cache\n")
REPLACE_LINE = ("    os.replace(tmp, path)                "
                "# readers see the old file or the new, never half\n")
FSYNC_RENAMED = ("    with open(path, 'rb+') as renamed:\n"
                 "        os.fsync(renamed.fileno())\n")
RNG_LINE = ("    torch.set_rng_state(state[\"rng\"][dist.get_rank()])     "
            "# this rank's, not rank 0's\n")
SNAPSHOT_MISTAKES = {
    "rng_not_restored": ([(RNG_LINE, "")], "random-number state was not restored"),
    "rank0_rng_everywhere": ([('state["rng"][dist.get_rank()]', 'state["rng"][0]')],
                             "rank 1's random-number state is not its own"),
    "optimizer_not_restored": (
        [('    optimizer.load_state_dict(state["optimizer"])', '    pass  #')],
        "Adam started again with zero moments"),
    "model_not_restored": (
        [('    model.load_state_dict(state["model"])', '    pass  #')],
        "model's weights were not restored"),
    "epoch_restarted": (
        [("for i in range(skip, per_epoch):", "for i in range(0, per_epoch):")],
        "repeated"),
    "no_set_epoch": ([("        sampler.set_epoch(epoch)", "        pass  #")],
                     "set_epoch"),
    "non_atomic": ([('tmp = f"{path}.tmp"', "tmp = path")], "non-atomic write"),
    "no_fsync": ([(FSYNC_LINE, "")], "never fsynced the temporary file"),
    "fsync_after_the_rename": (
        [(FSYNC_LINE, ""), (REPLACE_LINE, REPLACE_LINE + FSYNC_RENAMED)],
        "fsynced the new snapshot only after the rename"),
    "temporary_file_in_tmp": (
        [("import os\n", "import os\nimport tempfile\n"),
         ('tmp = f"{path}.tmp"', "tmp = tempfile.mkstemp(suffix='.tmp')[1]")],
        "Invalid cross-device link"),
    "every_rank_writes": ([("if dist.get_rank() == 0:", "if True:")],
                          "only rank 0 writes"),
}


@pytest.mark.parametrize("mistake", sorted(SNAPSHOT_MISTAKES))
def test_snapshot_mistakes_get_their_hint(folder, mistake):
    """Does each classic snapshot mistake fail with the hint that names it?"""
    replace, hint = SNAPSHOT_MISTAKES[mistake]
    path = _write(folder, "snapshot.py", replace)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.snapshot_resume(path)


def test_snapshot_mistake_leaves_no_torn_file_in_tmp(folder):
    """A temporary file in /tmp: does the check remove the torn one its kill left?"""
    replace, hint = SNAPSHOT_MISTAKES["temporary_file_in_tmp"]
    before = set(Path(tempfile.gettempdir()).glob("tmp*.tmp"))
    with pytest.raises(ExerciseFailed, match=hint):
        checks.snapshot_resume(_write(folder, "snapshot.py", replace))
    assert set(Path(tempfile.gettempdir()).glob("tmp*.tmp")) <= before


def test_dataloader_drawing_from_the_global_rng_gets_its_hint(folder):
    """A DataLoader without its own generator: is that the cause the hint leads with?

    The RNG state *was* restored; the loader's iterator then drew its base seed
    from it. The hint must say so first, not that the state was not restored.
    """
    source = (ALTERNATIVES / "lab09_snapshot_examples.py").read_text()
    own = "            generator=torch.Generator().manual_seed(cfg.seed))"
    assert source.count(own) == 1
    (folder / "snapshot.py").write_text(source.replace(own, "            )"))
    with pytest.raises(ExerciseFailed) as failed:
        checks.snapshot_resume(folder / "snapshot.py")
    hint = str(failed.value).split("uninterrupted one: ", 1)[1]
    assert hint.startswith("the random-number state was restored"), hint
    assert "DataLoader" in hint and "not restored" not in hint


# ---------------------------------------------------------------- exercise 9.2 mistakes

@pytest.mark.parametrize("replace, hint", [
    ([('"step_*.pt"', '"step_*"')], "never load it"),
    ([("return done[-1] if done", "return done[0] if done")], "newest"),
])
def test_latest_snapshot_mistakes_get_their_hint(folder, replace, hint):
    """Does latest_snapshot picking a torn .tmp or the oldest file get its hint?"""
    _write(folder, "snapshot.py")
    path = _write(folder, "elastic_train.py", replace)
    with pytest.raises(ExerciseFailed, match=hint):
        checks.elastic_restart(path, folder / "snapshot.py")


def test_script_that_never_resumes_gets_its_hint(folder):
    """Does a script that restarts from step 0 fail, although its weights are right?"""
    _write(folder, "snapshot.py")
    path = _write(folder, "elastic_train.py", [(
        "    step = load_snapshot(path, model.module, optimizer) if path else 0",
        "    step = 0")])
    with pytest.raises(ExerciseFailed, match="started again from step 0"):
        checks.elastic_restart(path, folder / "snapshot.py")


class _Running:
    """A torchrun process that has not ended (for the pause's wait)."""

    def poll(self):
        return None


def test_the_pause_waits_for_one_whole_attempt(tmp_path):
    """A first attempt that failed with only rank 0 held (a rendezvous refused on a
    loaded machine): is the kill aimed at the attempt where every rank holds?"""
    (tmp_path / "paused.rank0.restart0").write_text("1")   # rank 1 of attempt 0 died
    deadline = elastic.time.monotonic() + 0.5
    assert elastic._wait_for_pause(tmp_path, 2, _Running(), deadline) is None
    for rank in range(2):
        (tmp_path / f"paused.rank{rank}.restart1").write_text("2")
    assert elastic._wait_for_pause(tmp_path, 2, _Running(), deadline + 5) == 1
    run = elastic.Run(0, "", [{"rank": r, "restart": k, "step": 0}
                              for k in range(3) for r in range(2)],
                      killed={"rank": 1, "restart": 1})
    assert [(s["rank"], s["restart"]) for s in run.after_kill()] == [(0, 2), (1, 2)]


def test_no_attempt_holds_after_the_kill(tmp_path, monkeypatch):
    """Once the parent has killed, does a restarted rank go on without holding?"""
    monkeypatch.setenv(elastic.PAUSE_ENV, "12")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    (tmp_path / elastic.KILLED).write_text("0")
    rank = launch.RankContext(0, 2, 0, "gloo", torch.device("cpu"))
    start = elastic.time.monotonic()
    elastic.pause_if_asked(tmp_path, rank, 12)
    assert elastic.time.monotonic() - start < 1.0
    assert not list(tmp_path.glob("paused.*"))


# ---------------------------------------------------------------- exercise 9.3 mistakes

def test_watchdog_that_is_never_rearmed_gets_its_hint(folder):
    """Does a watchdog armed once (no pet) fail in a long healthy run?"""
    path = _write(folder, "hang_finder.py", [
        ("        faulthandler.dump_traceback_later(self.seconds, repeat=False, "
         "file=self.file)\n", "        pass\n"),
        ("        self.pet()\n", "        faulthandler.dump_traceback_later(seconds, "
         "file=self.file)\n")])
    with pytest.raises(ExerciseFailed, match="re-arm the countdown"):
        checks.hang_finder(path)


def test_hang_finder_names_each_ranks_line(folder, capsys):
    """On the hang, does each rank's dump name its own collective's line?"""
    path = _write(folder, "hang_finder.py")
    dumps = checks.hang_finder(path)
    assert "in all_reduce" in dumps[0] and "in broadcast" in dumps[1]
    assert_reported_lines_hang(capsys.readouterr().out, path)


def assert_reported_lines_hang(out: str, path) -> None:
    """The pass line's 'rank 0 was at F:N' must be each rank's collective call."""
    lines = dict(re.findall(r"rank (\d) (?:was )?at \S+?:(\d+)", out))
    source = Path(path).read_text().splitlines()
    assert "dist.all_reduce(" in source[int(lines["0"]) - 1], out
    assert "dist.broadcast(" in source[int(lines["1"]) - 1], out


def test_watchdog_dumping_only_its_own_thread_gets_its_hint(folder):
    """A timer thread that dumps only itself: is it told to dump every thread?"""
    source = (ALTERNATIVES / "lab09_hang_finder_timer.py").read_text()
    dump = "faulthandler.dump_traceback(file=self.file, all_threads=True)"
    assert source.count(dump) == 1
    path = folder / "hang_finder.py"
    path.write_text(source.replace(dump, dump.replace("True", "False")))
    with pytest.raises(ExerciseFailed, match="only the watchdog's own thread "
                                             r"\(hang_finder.py:\d+ in _fire\)"):
        checks.hang_finder(path)


# ---------------------------------------------------------------- the launcher's DETAIL


def test_ranks_read_torch_distributed_debug_set_after_the_launcher_started(
        folder, monkeypatch):
    """Does TORCH_DISTRIBUTED_DEBUG set in the notebook reach forkserver ranks?"""
    (folder / "debug_worker.py").write_text(
        "import torch.distributed as dist\n\n\n"
        "def level(ctx):\n    return str(dist.get_debug_level())\n")
    debug_worker = importlib.import_module("debug_worker")
    launch.warm_up()   # the forkserver imports torch before the variable is set
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    levels = launch.run(debug_worker.level, 2, backend="gloo", timeout=30)
    assert levels == ["DebugLevel.DETAIL"] * 2
