"""Lab 09, exercise 9.1: the fsync and same-folder judgements accept every correct
style of atomic save and name each mistake.

The saves are written to a module file, as a learner's cell would, so that names
bound by ``from os import fsync`` are watched too. No ranks: each save runs here.
"""

import importlib
import io
import sys

import pytest
import torch

from labkit.labs.fault_tolerance import durability, snapshots

STYLES = '''
import os
import tempfile
from os import fsync
from pathlib import Path

import torch


def _fsync_folder(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def course(obj, path):            # the notebook's: file object, fsync, replace, folder
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_folder(os.path.dirname(os.path.abspath(path)))


def named_temporary_file(obj, path):   # tempfile in the folder, Path.replace, fdatasync
    folder = Path(path).resolve().parent
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".tmp", delete=False) as f:
        torch.save(obj, f)
        os.fdatasync(f.fileno())
    Path(f.name).replace(path)
    _fsync_folder(folder)


def imported_fsync_of_a_path(obj, path):   # torch.save(path), reopen, `from os import`
    tmp = path + ".part"
    torch.save(obj, tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def sync_everything(obj, path):   # os.sync() after writing: heavy-handed, but synced
    tmp = f"{path}.tmp"
    torch.save(obj, tmp)
    os.sync()
    os.replace(tmp, path)
    os.sync()


def no_fsync(obj, path):
    tmp = f"{path}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def fsync_too_early(obj, path):   # before torch.save wrote anything
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        os.fsync(f.fileno())
        torch.save(obj, f)
    os.replace(tmp, path)


def fsync_after_the_rename(obj, path):
    tmp = f"{path}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
'''


@pytest.fixture
def saves(tmp_path, monkeypatch):
    (tmp_path / "save_styles.py").write_text(STYLES)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("save_styles", None)
    return importlib.import_module("save_styles")


def _judge(saves, style: str, folder) -> tuple:
    path = str(folder / "snapshot.pt")
    with durability.watch_syncs(saves, path) as events:
        getattr(saves, style)({"step": 1, "w": torch.ones(3)}, path)
    return durability.judge_syncs(events, path)


@pytest.mark.parametrize("style, folder_synced", [
    ("course", True), ("named_temporary_file", True),
    ("imported_fsync_of_a_path", False), ("sync_everything", True)])
def test_correct_saves_are_synced(saves, tmp_path, style, folder_synced):
    """Is every correct style's file seen fsynced before its rename?"""
    assert _judge(saves, style, tmp_path) == (None, folder_synced)


@pytest.mark.parametrize("style, hint", [
    ("no_fsync", "never fsynced the temporary file"),
    ("fsync_too_early", "never fsynced the temporary file"),
    ("fsync_after_the_rename", "only after the rename")])
def test_unsynced_saves_get_their_hint(saves, tmp_path, style, hint):
    """Does each missing or misplaced fsync get the hint that names it?"""
    problem, _folder = _judge(saves, style, tmp_path)
    assert problem and hint in problem


def test_the_watch_puts_os_back(saves, tmp_path):
    """After the watch, are os.fsync and the module's own name the real ones?"""
    real = durability.os.fsync
    _judge(saves, "imported_fsync_of_a_path", tmp_path)
    assert durability.os.fsync is real and saves.fsync is real


@pytest.mark.parametrize("writing, device, wrong", [
    ("{folder}/snapshot.pt.tmp", 0, False),
    ("{folder}/sub/tmp123.tmp", 0, False),
    ("{folder}/snapshot.pt.tmp", -1, False),     # device unknown: the folder decides
    ("?", -1, False),                            # nothing known: nothing judged
    ("/tmp/tmp123.tmp", 0, True),
    ("{folder}/snapshot.pt.tmp", 12345, True)])  # another file system
def test_the_temporary_file_must_be_in_the_folder(tmp_path, writing, device, wrong):
    """Is a temporary file outside the snapshot's folder (or device) named?"""
    device = tmp_path.stat().st_dev if device == 0 else device
    report = {"writing_path": writing.format(folder=tmp_path),
              "writing_device": device}
    problem = durability.judge_temporary_folder(report, str(tmp_path / "snapshot.pt"))
    assert bool(problem) == wrong
    assert not problem or "Invalid cross-device link" in problem


@pytest.mark.parametrize("make_file", [io.BytesIO, lambda: None])
def test_the_stalled_save_notes_where_it_wrote(tmp_path, monkeypatch, make_file):
    """Does the kill's stand-in torch.save note the file it wrote and its device,
    and -1 for a buffer (a save that serializes into io.BytesIO first is correct)?"""
    monkeypatch.setattr(snapshots, "STALL_S", 0.0)
    marker = tmp_path / "stalled"
    monkeypatch.setenv("LABKIT_STALL_MARKER", str(marker))
    target = make_file() or str(tmp_path / "snapshot.pt.tmp")
    snapshots._stalling_save({"w": torch.ones(3)}, target)
    writing, _half, _total, device = marker.read_text().split("\n")[:4]
    if isinstance(target, str):
        assert (writing, int(device)) == (target, tmp_path.stat().st_dev)
    else:
        assert (writing, int(device)) == ("?", -1)
