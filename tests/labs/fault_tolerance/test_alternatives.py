"""Lab 09: correct solutions written in other idioms pass their checks.

Each module in tests/alternatives/lab09_*.py is a whole solution of one program
exercise in another style: pytorch/examples' ``_save_snapshot``/``_load_snapshot``
with its upper-case keys, torch.distributed.checkpoint, pathlib, a timer-thread
watchdog. The checks judge what a solution does, so each must pass.
"""

import shutil
import sys
from pathlib import Path

import pytest
from notebook_cells import write_program

from labkit.labs.fault_tolerance import checks

from .test_fault_tolerance import assert_reported_lines_hang

ALTERNATIVES = Path(__file__).resolve().parent / "alternatives"
NOTEBOOK = "09_fault_tolerance.ipynb"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for name in ("snapshot", "elastic_train", "hang_finder"):
        sys.modules.pop(name, None)
    return tmp_path


def _copy(alternative: str, folder: Path, module: str) -> str:
    shutil.copy(ALTERNATIVES / alternative, folder / module)
    return str(folder / module)


@pytest.mark.parametrize("alternative", ["lab09_snapshot_examples.py",
                                         "lab09_snapshot_dcp.py"])
def test_snapshot_in_another_idiom_passes(folder, capsys, alternative):
    """Does a bit-exact snapshot written another way pass snapshot_resume?"""
    checks.snapshot_resume(_copy(alternative, folder, "snapshot.py"))
    assert "✅ snapshot_resume: passed" in capsys.readouterr().out


def test_elastic_script_in_another_idiom_passes(folder, capsys):
    """Does a pathlib script, on the pytorch/examples snapshot, survive the kill?"""
    _copy("lab09_snapshot_examples.py", folder, "snapshot.py")
    checks.elastic_restart(_copy("lab09_elastic_train_pathlib.py", folder,
                                 "elastic_train.py"), folder / "snapshot.py")
    assert "✅ elastic_restart: passed" in capsys.readouterr().out


def test_solution_script_on_a_dcp_snapshot_passes(folder, capsys):
    """Does the notebook's elastic script pass on top of the DCP snapshot?"""
    _copy("lab09_snapshot_dcp.py", folder, "snapshot.py")
    path = write_program(folder, NOTEBOOK, "elastic_train.py")
    checks.elastic_restart(str(path), folder / "snapshot.py")
    assert "✅ elastic_restart: passed" in capsys.readouterr().out


def test_timer_thread_watchdog_passes(folder, capsys):
    """Does a threading.Timer watchdog (faulthandler.dump_traceback) pass?"""
    path = _copy("lab09_hang_finder_timer.py", folder, "hang_finder.py")
    dumps = checks.hang_finder(path)
    out = capsys.readouterr().out
    assert "✅ hang_finder: passed" in out
    assert "in all_reduce" in dumps[0] and "in broadcast" in dumps[1]
    assert_reported_lines_hang(out, path)   # the blocked lines, not the timer's own
