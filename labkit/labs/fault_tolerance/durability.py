"""What a save did for a power cut: its fsyncs, and where its temporary file was.

Taught in: lab 09 (exercise 9.1, ``save_atomic``). A kill in the middle of a save
shows whether the write is atomic (``snapshots.kill_during_save``); a power cut
needs two more things that a running machine can still see:

- the temporary file's bytes reach the disk *before* the rename (``os.fsync`` of
  the file): else the rename can land first, and after the cut ``path`` names a file
  whose bytes were never written, while the previous snapshot is gone;
- the temporary file is in the snapshot's own folder: ``os.replace`` is a rename,
  which cannot cross file systems (``OSError: [Errno 18] Invalid cross-device
  link`` with the snapshots on ``/dev/shm`` and the temporary file in ``/tmp``).

``watch_syncs`` records every ``os.fsync``, ``os.fdatasync`` and ``os.sync`` of a
save, with what the file was at that moment; ``judge_syncs`` reads the record.
Whether the disk itself honours an fsync only a real power cut shows.
"""

import os
import stat
from contextlib import contextmanager

from labkit.messages import _

__all__ = ["judge_syncs", "judge_temporary_folder", "watch_syncs"]

_SYNCS = ("fsync", "fdatasync", "sync")


def _identity(st) -> tuple:
    return st.st_dev, st.st_ino


def _named(path: str) -> tuple | None:
    """Return (device, inode) of what ``path`` names now, or None."""
    try:
        return _identity(os.stat(path))
    except OSError:
        return None


def _siblings(folder: str) -> dict:
    """Return {name: ((device, inode), size)} of the regular files in ``folder``."""
    found = {}
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            st = entry.stat(follow_symlinks=False)
            found[entry.name] = (_identity(st), st.st_size)
    return found


def _spy(kind: str, original, events: list, path: str):
    """Wrap ``os.<kind>``: note what it synced, then really sync it."""
    folder = os.path.dirname(os.path.abspath(path))

    def spied(*args):
        event = {"kind": kind, "at_path": _named(path)}
        if kind == "sync":
            event["folder"] = _siblings(folder)
        else:
            fd = args[0] if isinstance(args[0], int) else args[0].fileno()
            st = os.fstat(fd)
            event.update(file=_identity(st), size=st.st_size,
                         is_dir=stat.S_ISDIR(st.st_mode))
        events.append(event)
        return original(*args)

    return spied


@contextmanager
def watch_syncs(module, path: str):
    """Record (into the list it yields) each sync a save to ``path`` makes.

    ``os.fsync`` and friends are replaced in ``os`` and wherever ``module`` bound them
    by name (``from os import fsync``), and put back afterwards.
    """
    events: list = []
    originals = {kind: getattr(os, kind) for kind in _SYNCS if hasattr(os, kind)}
    spies = {kind: _spy(kind, fn, events, path) for kind, fn in originals.items()}
    by_id = {id(fn): spies[kind] for kind, fn in originals.items()}
    imported = {name: value for name, value in vars(module).items()
                if id(value) in by_id}
    for kind, spy in spies.items():
        setattr(os, kind, spy)
    for name, value in imported.items():
        setattr(module, name, by_id[id(value)])
    try:
        yield events
    finally:
        for kind, fn in originals.items():
            setattr(os, kind, fn)
        for name, value in imported.items():
            setattr(module, name, value)


def _data_synced_before_rename(events: list, final, size: int, name: str) -> bool:
    """Was the complete new file synced while ``path`` did not name it yet?"""
    for e in events:
        if e["at_path"] == final:
            continue   # already renamed (or never a temporary file at all)
        if e["kind"] == "sync" and any(
                ident == final and length == size
                for other, (ident, length) in e["folder"].items() if other != name):
            return True
        if e["kind"] != "sync" and e["file"] == final and e["size"] == size:
            return True
    return False


def judge_syncs(events: list, path: str) -> tuple[str | None, bool]:
    """Return (what is missing for a power cut, or None; was the folder synced).

    ``events`` come from ``watch_syncs`` around one successful save to ``path``.
    """
    st = os.stat(path)
    final = _identity(st)
    folder = _named(os.path.dirname(os.path.abspath(path)))
    folder_synced = any(
        e["at_path"] == final and (e["kind"] == "sync"
                                   or (e["is_dir"] and e["file"] == folder))
        for e in events)
    if _data_synced_before_rename(events, final, st.st_size, os.path.basename(path)):
        return None, folder_synced
    files = [e for e in events if e["kind"] == "sync" or not e["is_dir"]]
    if any(e["at_path"] == final for e in files):
        return _("save_atomic fsynced the new snapshot only after the rename: until "
                 "then a power cut can leave path naming a file whose bytes never "
                 "reached the disk, and the previous snapshot is gone. os.fsync the "
                 "temporary file before os.replace (and the folder after it)."
                 ), folder_synced
    return _("save_atomic never fsynced the temporary file ({count} fsync call(s) "
             "seen, none of the complete file that path names now). The rename can "
             "then reach "
             "the disk before the bytes do: after a power cut path names an empty or "
             "partial file, and the previous snapshot is gone. After torch.save: "
             "f.flush(); os.fsync(f.fileno()), then os.replace.").format(
                 count=len(events)), folder_synced


def judge_temporary_folder(report: dict, path: str) -> str | None:
    """Say why the temporary file of a killed save (``report``) is in the wrong place.

    It must be in the snapshot's folder (or below it) and on its file system, or
    ``os.replace`` fails where the snapshots are on another one. None when it is.
    """
    writing = report.get("writing_path")
    if not writing or writing == "?":
        return None   # not known on this system: nothing to judge
    temporary = os.path.dirname(os.path.realpath(writing))
    target = os.path.dirname(os.path.realpath(path))
    device = report.get("writing_device", -1)
    inside = os.path.commonpath([temporary, target]) == target
    if inside and device in (-1, os.stat(target).st_dev):
        return None
    return _("save_atomic wrote its temporary file in {temporary}, not in the "
             "snapshot's folder {target}. os.replace is a rename, and a rename cannot "
             "cross file systems: with the snapshots on another one (/dev/shm, a "
             "network disk) it fails with OSError: [Errno 18] Invalid cross-device "
             "link. Create the temporary file next to path (f'{{path}}.tmp', or "
             "tempfile.mkstemp(dir=os.path.dirname(path))).").format(
                 temporary=temporary, target=target)
