"""Checks for lab 09 (fault tolerance): the snapshot functions, the elastic torchrun
script, and the hang finder.

``snapshot_resume`` kills a process in the middle of the learner's save, then runs
the course's loop (``labkit.labs.fault_tolerance.snapshots.train``) with the learner's functions on 2 gloo
ranks three times: uninterrupted, interrupted after a snapshot, and resumed in fresh
processes; the resumed weights must equal the uninterrupted ones bit for bit. Each
run logs, per step and rank, the first sample, the RNG checksum and the loss, so the
hint can name what the snapshot lost. ``elastic_restart`` runs the learner's script
under ``torchrun --max-restarts`` (its ranks forked with torch imported) and SIGKILLs a
rank at a known step, and ``timed_restart`` does the same under the real torchrun,
for the lab's measurement;
``hang_finder`` launches a deliberate collective mismatch under the learner's
watchdog and reads where each rank says it is.
"""

import functools
import importlib
import linecache
import os
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from labkit import crowding
from labkit.labs.fault_tolerance import durability, elastic, snapshots
from labkit.checks._core import ExerciseFailed, attempt, passed
from labkit.checks._reference import use_reference
from labkit.checks._solved import has_passed, prerequisite, solved
from labkit.checks._programs import launch_program, load_program
from labkit.messages import _

__all__ = ["use_reference", "solved", "has_passed",
           "snapshot_resume", "elastic_restart", "timed_restart", "hang_finder",
           "resumable"]

QUICK_CFG = snapshots.Config(steps=24, every=4)   # 8 steps per epoch on 2 ranks
STOP_AT = 12   # mid-epoch 1: the position and the epoch both matter


# ---------------------------------------------------------------- exercise 9.1


def _save_once(name: str, module, folder: str) -> tuple[str | None, bool]:
    """Save with save_atomic, watching its fsyncs; say what a power cut would find.

    Returns (what is missing for a power cut, or None; was the folder fsynced).
    """
    path = os.path.join(folder, "plain.pt")
    with durability.watch_syncs(module, path) as syncs:
        attempt(name, module.save_atomic, {"step": 1, "w": torch.ones(3)}, path)
    if not os.path.exists(path) or torch.load(path)["step"] != 1:
        raise ExerciseFailed(_("{name}: save_atomic(obj, path) did not leave obj "
                               "at path (torch.load(path) must give it back)."
                               ).format(name=name))
    left = sorted(set(os.listdir(folder)) - {"plain.pt"})
    if left:
        raise ExerciseFailed(_("{name}: after a successful save_atomic, {left} is "
                               "left next to the snapshot: os.replace the "
                               "temporary file onto path (it then no longer "
                               "exists).").format(name=name, left=left))
    found = durability.judge_syncs(syncs, path)
    os.remove(path)
    return found


def _check_atomic(name: str, module) -> tuple[dict, bool]:
    """Save once, then SIGKILL a save half-way: the old snapshot must survive.

    The first save's fsyncs are recorded, and the killed one shows where the
    temporary file was: both are judged once the kill has shown the save atomic.
    Returns the kill's report and whether the folder was fsynced after the rename.
    """
    folder, report = tempfile.mkdtemp(prefix="labkit-atomic-check-"), {}
    try:
        unsynced, folder_synced = _save_once(name, module, folder)
        report = snapshots.kill_during_save(module.save_atomic, folder)
        _atomic_hint(name, report)
        misplaced = durability.judge_temporary_folder(
            report, os.path.join(folder, "snapshot.pt"))
    finally:
        shutil.rmtree(folder)
        _remove_torn_file(report, folder)
    for problem in (misplaced, unsynced):
        if problem:
            raise ExerciseFailed(_("{name}: {problem}").format(name=name,
                                                               problem=problem))
    return report, folder_synced


def _remove_torn_file(report: dict, folder: str) -> None:
    """Remove the torn temporary file the check's killed save left outside folder."""
    torn = report.get("writing_path")
    if torn and torn != "?" and not torn.startswith(folder) and os.path.isfile(torn):
        os.remove(torn)


def _atomic_hint(name: str, report: dict) -> None:
    """Fail with the right hint unless the killed save left the old snapshot intact."""
    if not report["stalled"] and not report.get("finished", True):
        raise ExerciseFailed(_(
            "{name}: the process saving with save_atomic neither reached torch.save "
            "nor ended within the check's time limit (is the machine very busy, or "
            "does save_atomic wait for something?). Run the check again.").format(
                name=name))
    if not report["stalled"]:
        raise ExerciseFailed(_(
            "{name}: save_atomic never called torch.save(obj, f) (the check slows "
            "torch.save down to kill the process in the middle of it). Write the "
            "snapshot with torch.save.").format(name=name))
    if report["previous_intact"]:
        return
    raise ExerciseFailed(_(
        "{name}: a process killed after writing {written} of "
        "{total} bytes into {writing} left snapshot.pt "
        "{state} "
        "({error}). That is a non-atomic "
        "write: torch.save into a temporary file in the same folder (f'{{path}}.tmp'), "
        "then os.replace(tmp, path): a rename is atomic, the old file stays whole "
        "until the new one is complete.").format(
            name=name, written=report["written"], total=report["total"],
            writing=report["writing"],
            state=_("holding something else") if report["loads"] else _("unreadable"),
            error=report["error"] or _("not the previous snapshot")))


def _first_two(batches, cfg, start: int) -> list:
    """Return the first two index batches rank 1 of 2 gets from ``start`` on."""
    found = batches(cfg, 1, 2, start)
    return [[int(i) for i in next(found)] for _unused in range(2)]


def _batch_hint(got: list, cfg, start: int, per_epoch: int) -> str:
    """Name the sampler-position mistake that yields ``got`` when resuming at start."""
    def want(step):
        return _first_two(snapshots.sampler_batches, cfg, step)
    if start % per_epoch and got == want(start - start % per_epoch):
        return _("You restarted the epoch from its first batch: the batches already "
                 "trained on are repeated. Skip start_step % steps_per_epoch batches.")
    if start >= per_epoch and got == want(start % per_epoch):
        return _("That is epoch 0's order: call sampler.set_epoch(start_step // "
                 "steps_per_epoch), else the resumed run reshuffles like epoch 0.")
    return _("Epoch e is DistributedSampler(..., shuffle=True, seed=cfg.seed, "
             "drop_last=True) after set_epoch(e); step s is batch s % steps_per_epoch "
             "of epoch s // steps_per_epoch.")


def _check_batches(name: str, module, cfg) -> None:
    """Compare the learner's batches with DistributedSampler's, at several starts."""
    per_epoch = snapshots.steps_per_epoch(cfg, 2)
    for start in (0, 3, per_epoch, STOP_AT):
        got = attempt(name, _first_two, module.batches, cfg, start)
        want = _first_two(snapshots.sampler_batches, cfg, start)
        if got != want:
            raise ExerciseFailed(_(
                "{name}: batches(cfg, rank=1, world_size=2, start_step={start}) "
                "starts {got}..., DistributedSampler's position gives "
                "{want}.... {hint}").format(
                    name=name, start=start, got=got[0][:4], want=want[0][:4],
                    hint=_batch_hint(got, cfg, start, per_epoch)))


def resumable(ctx, module_name: str, fields: dict, path: str,
              stop_at: int | None = None, resume: bool = False) -> dict:
    """Rank worker: the course's loop with the learner's snapshot functions."""
    module = importlib.import_module(module_name)
    cfg = snapshots.Config(**fields)

    def load(model, optimizer):
        return module.load_snapshot(path, model, optimizer)

    def save(model, optimizer, step):
        module.save_snapshot(path, model, optimizer, step)

    return snapshots.train(ctx, cfg, module.batches, load if resume else None, save,
                           stop_at)


def _explain_crash(text: str) -> str | None:
    """Name the mistake behind an exception in the learner's snapshot code."""
    if "FileNotFoundError" in text and ".tmp" in text:
        return _("Two ranks wrote the same temporary file: only rank 0 writes "
                 "(dist.get_rank() == 0), every rank calls the barrier.")
    if "FileNotFoundError" in text:
        return _("No snapshot at path when the resumed run started: save_snapshot "
                 "must write it (rank 0) before the interrupted run stops.")
    if "KeyError" in text:
        return _("load_snapshot reads a key that save_snapshot did not write.")
    if "IndexError" in text and "rng" in text:
        return _("Save every rank's RNG state (all_gather_object), index it by rank.")
    return None


def _runs(name: str, module, cfg, folder: str) -> list:
    """Launch uninterrupted, interrupted and resumed runs; return their rank results."""
    path, fields = os.path.join(folder, "snapshot.pt"), asdict(cfg)
    runs = []
    for stop_at, resume in ((None, False), (STOP_AT, False), (None, True)):
        if not resume and os.path.exists(path):
            os.remove(path)   # the interrupted run starts from nothing, too
        runs.append(launch_program(
            name, resumable, 2, args=(module.__name__, fields, path, stop_at, resume),
            timeout=30, explain=_explain_crash, module=module.__name__,
            hang_hint=_("save_snapshot is called on every rank: does every rank reach "
                        "the same collectives (all_gather_object, barrier)?")))
    return runs


def _rng_hint(full: list, resumed: list) -> str | None:
    """Name what went wrong with the ranks' RNG states on resume, from the evidence.

    Three checksums per rank tell the causes apart: the uninterrupted run's before
    step STOP_AT (``want``), the resumed run's right after ``load_snapshot``
    (``restored``) and before its first step (``first``). build() seeded
    ``rng_built``: a state still equal to it was never restored.
    """
    want = [next(e["rng"] for e in run["log"] if e["step"] == STOP_AT)
            for run in full]
    for rank, run in enumerate(resumed):
        restored = run["rng_restored"]
        if restored == want[rank]:
            continue
        if rank > 0 and restored == want[0]:
            return _("rank {rank}'s random-number state is not its own: load_snapshot "
                     "gave it rank 0's. Every rank has its own RNG stream: "
                     "all_gather_object every rank's torch.get_rng_state() into the "
                     "snapshot, and restore state['rng'][rank].").format(rank=rank)
        if restored == run["rng_built"]:
            return _("the random-number state was not restored: on rank {rank}, "
                     "load_snapshot left torch's RNG as build() seeded it, so the "
                     "dropout masks differ from the uninterrupted run's. Save "
                     "torch.get_rng_state() of every rank and "
                     "torch.set_rng_state(...) on resume.").format(rank=rank)
        return _("on rank {rank}, load_snapshot set torch's RNG to a state the "
                 "uninterrupted run did not have after {stop_at} steps: save "
                 "torch.get_rng_state() right when the snapshot is taken (after the "
                 "step, in save_snapshot), and set nothing else random in "
                 "load_snapshot after restoring it.").format(rank=rank,
                                                              stop_at=STOP_AT)
    drawn = [r for r, run in enumerate(resumed) if run["log"][0]["rng"] != want[r]]
    if drawn:
        return _("the random-number state was restored (it matches at the end of "
                 "load_snapshot), then something drew from torch's global RNG before "
                 "the first resumed step, on rank(s) {ranks}: the batches. A "
                 "DataLoader iterator draws its base seed from torch's RNG unless it "
                 "has its own generator=torch.Generator(); the uninterrupted run drew "
                 "at other steps, so the dropout masks differ.").format(ranks=drawn)
    return None


def _resume_hint(full: list, resumed: list) -> str | None:
    """Compare the ranks' resumed logs with the uninterrupted ones; name what differs.

    Causes first (step, batches, RNG on every rank), then effects (losses): one
    rank's wrong dropout changes every rank's loss through the averaged gradients.
    """
    want = [[e for e in run["log"] if e["step"] >= STOP_AT] for run in full]
    got = [run["log"] for run in resumed]
    for rank, run in enumerate(resumed):
        if run["start"] != STOP_AT:
            return _("load_snapshot returned {start} on rank {rank}, but the "
                     "snapshot was taken after {steps} steps: save the step and "
                     "return it.").format(start=run["start"], rank=rank, steps=STOP_AT)
        if [e["first"] for e in got[rank]] != [e["first"] for e in want[rank]]:
            return _("rank {rank} trained on other batches after resuming (see "
                     "batches).").format(rank=rank)
    rng = _rng_hint(full, resumed)
    if rng:
        return rng
    if got[0][0]["loss"] != want[0][0]["loss"]:
        return _("the first resumed loss differs with the same batch and dropout: the "
                 "model's weights were not restored (model.load_state_dict).")
    for g, w in zip(got[0], want[0]):
        if g["loss"] != w["loss"]:
            return _("the losses agree at step {stop_at} and part from step "
                     "{step} on: the optimizer state was not restored, so Adam "
                     "started again with zero moments (save optimizer.state_dict(), "
                     "load it with optimizer.load_state_dict).").format(
                         stop_at=STOP_AT, step=g["step"])
    return None


def snapshot_resume(path="snapshot.py", cfg=QUICK_CFG) -> dict:
    """Check the snapshot functions: atomic on a kill, bit-exact resume on 2 ranks.

    Returns what it measured: the killed save's report and the three runs' logs.
    """
    name = "snapshot_resume"
    module = load_program(path)
    report, folder_synced = _check_atomic(name, module)
    _check_batches(name, module, cfg)
    folder = tempfile.mkdtemp(prefix="labkit-resume-check-")
    try:
        full, stopped, resumed = _runs(name, module, cfg, folder)
    finally:
        shutil.rmtree(folder)
    hint = _resume_hint(full, resumed)
    same = all(torch.equal(full[r]["weights"][k], resumed[r]["weights"][k])
               for r in range(2) for k in full[r]["weights"])
    if hint or not same:
        raise ExerciseFailed(_(
            "{name}: stopped after {stop_at} of {steps} steps and resumed in new "
            "processes, the run does not redo the uninterrupted one: "
            "{hint}").format(
                name=name, stop_at=STOP_AT, steps=cfg.steps,
                hint=hint or _("the weights differ (and nothing in the log says "
                               "why).")))
    folder_line = (_("the folder was fsynced after the rename") if folder_synced
                   else _("the folder was not fsynced after the rename: a power cut "
                          "right after a save may bring back the previous snapshot "
                          "(whole, one snapshot older)"))
    passed(name, _("killed mid-save, the previous snapshot stayed whole; the "
                   "temporary file was in the snapshot's folder and fsynced before "
                   "the rename, {folder_line}; resumed at step {stop_at}, all "
                   "{tensors} tensors equal the uninterrupted run's bit for bit after "
                   "{steps} steps. Not checked here: that the disk keeps what fsync "
                   "was told (only a power cut shows it), CUDA RNG states (CPU ranks)."
                   ).format(
                       folder_line=folder_line, stop_at=STOP_AT,
                       tensors=len(full[0]["weights"]), steps=cfg.steps))
    return {"kill": report, "full": full, "stopped": stopped, "resumed": resumed}


# ---------------------------------------------------------------- exercise 9.2

KILL_AT = 12   # every rank holds here on the first attempt; rank 1 is killed there


def _check_latest(name: str, module) -> None:
    """Call latest_snapshot on folders the check fills: newest complete one, or None."""
    folder = tempfile.mkdtemp(prefix="labkit-latest-check-")
    try:
        if attempt(name, module.latest_snapshot, folder) is not None:
            raise ExerciseFailed(_("{name}: latest_snapshot of an empty folder must "
                                   "be None (a first start trains from step 0)."
                                   ).format(name=name))
        for file in ("step_000004.pt", "step_000008.pt", "step_000012.pt.tmp"):
            Path(folder, file).write_bytes(b"")
        got = attempt(name, module.latest_snapshot, folder)
        got = os.path.basename(got) if got else got
        if got != "step_000008.pt":
            why = (_("a .tmp file is a save that was killed half-way: never load it.")
                   if got and got.endswith(".tmp") else
                   _("take the newest (highest step) complete step_*.pt."))
            raise ExerciseFailed(_(
                "{name}: with step_000004.pt, step_000008.pt and step_000012.pt.tmp "
                "in the folder, latest_snapshot gave {got!r}, not step_000008.pt: "
                "{why}").format(name=name, got=got, why=why))
    finally:
        shutil.rmtree(folder)


def _log_hint(log: str) -> str:
    """Name what went wrong in a torchrun run, from its log."""
    if "NotImplementedError" in log:
        return _("not done yet: a function still raises NotImplementedError.")
    if "Connection refused" in log and "connectFullMesh" in log:
        return _("the restarted group read the dead group's addresses: run torchrun "
                 "with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (the check does).")
    if any(s in log for s in ("Errno 22", "zip archive", "UnpicklingError")):
        return _("a rank loaded a file that is not a complete snapshot (a half-written "
                 ".tmp?): load only the newest complete step_*.pt.")
    errors = [line.strip() for line in log.splitlines()
              if "Error" in line and not line.startswith(" ")]
    return _("the last error was: {error}").format(
        error=errors[-1] if errors else _("(none in the log)"))


def _start_hint(run, steps: int) -> str | None:
    """Check the restarted attempt resumed at the snapshot taken at KILL_AT."""
    resumed = run.after_kill()
    if len(resumed) != 2:
        return _("expected one restart of both ranks, found start records "
                 "{records}.").format(records=[(s["rank"], s["restart"])
                                               for s in run.starts])
    wrong = [s for s in resumed if s["step"] != KILL_AT]
    if not wrong:
        return None
    got = wrong[0]["step"]
    if got == 0:
        return _("after the restart rank {rank} started again from step 0: load the "
                 "newest snapshot on start (latest_snapshot + load_snapshot); are the "
                 "snapshots saved every cfg.every steps?").format(rank=wrong[0]["rank"])
    return _("after the restart rank {rank} resumed at step {step}, but a "
             "snapshot of step {kill_at} existed: resume from the newest one.").format(
                 rank=wrong[0]["rank"], step=got, kill_at=KILL_AT)


def _stacks(log: str) -> list[str]:
    """Return the SIGUSR1 stack dumps in torchrun's log (rank 0's first), shortened."""
    blocks, current = [], None
    for line in log.splitlines():
        if line.startswith("Current thread"):
            current = []
            blocks.append(current)
        elif current is not None and line.startswith("  File "):
            path, rest = line.split('"')[1], line.split('"')[2]
            current.append(f"  {os.path.basename(path)}{rest}")
        else:
            current = None
    return [_("rank {rank}, holding at step {step}:").format(rank=rank, step=KILL_AT)
            + "\n" + "\n".join(block) for rank, block in enumerate(blocks)]


def _elastic_summary(run, folder) -> dict:
    """What the notebook prints: where it was killed, how fast it came back."""
    back = min(s["time"] for s in run.after_kill())
    agent = [line for line in run.log.splitlines()
             if "closing signal" in line or "failed (exitcode" in line]
    return {"killed": run.killed, "kill_step": KILL_AT, "restarts": run.restarts(),
            "resumed_at": [s["step"] for s in run.after_kill()],
            "restart_seconds": back - run.kill_time, "seconds": run.seconds,
            "stacks": _stacks(run.log), "agent_lines": agent,
            "snapshots": sorted(os.listdir(folder))}


@functools.lru_cache(maxsize=2)
def _uninterrupted_weights(name: str, steps: int) -> dict:
    """Rank 0's weights after an uninterrupted run of ``steps`` (labkit's reference,
    the same every time: a second attempt at the check does not run it again)."""
    return launch_program(name, snapshots.reference, 2,
                          args=(snapshots.Config(steps=steps),), timeout=30)[0]["weights"]


def _run_killed(name: str, path, steps: int, timeout: float, runner: str,
                stacks: bool) -> tuple[dict, dict]:
    """Run the script under ``runner`` with rank 1 SIGKILLed at KILL_AT; return rank
    0's final weights and what the notebook prints, or fail saying what went wrong."""
    crowding.wait_for_memory(3)   # torchrun's agent and 2 workers
    timeout = crowding.patience(timeout)
    folder = tempfile.mkdtemp(prefix="labkit-elastic-check-")
    Path(folder, f"step_{steps:06d}.pt.tmp").write_bytes(b"torn")   # a killed save
    try:
        run = elastic.torchrun_with_kill(Path(path).resolve(), (folder, steps), folder,
                                         pause_at=KILL_AT, timeout=timeout,
                                         stacks=stacks, runner=runner)
        problem = (_("torchrun did not finish within {timeout:g} s: a rank waits for "
                     "another (does every rank call save_snapshot?).").format(
                         timeout=timeout) + crowding.overload_note()
                   if run.timed_out else None)   # the crowd may be the cause
        if not problem and run.killed is None:
            problem = _("the run ended before every rank reached step {kill_at} (exit "
                        "code {code}): {hint}").format(kill_at=KILL_AT,
                                                       code=run.returncode,
                                                       hint=_log_hint(run.log))
        if not problem and run.returncode != 0:
            problem = _("after rank 1 was killed at step {kill_at}, torchrun gave up "
                        "(exit code {code}): {hint}").format(kill_at=KILL_AT,
                                                             code=run.returncode,
                                                             hint=_log_hint(run.log))
        problem = problem or _start_hint(run, steps)
        if problem:
            raise ExerciseFailed(_("{name}: {problem}").format(name=name,
                                                               problem=problem))
        weights = torch.load(os.path.join(folder, "final.pt"), weights_only=True)
        return weights, _elastic_summary(run, folder)
    finally:
        shutil.rmtree(folder)


def elastic_restart(path="elastic_train.py", snapshot_path="snapshot.py",
                    steps: int = 24, timeout: float = 150.0) -> dict:
    """Check the script under torchrun --max-restarts=3 survives a SIGKILLed rank.

    Runs it on 2 gloo ranks; every rank holds at step 12 of the first attempt, rank 1
    is killed there, torchrun restarts the group, the script must resume at step 12
    and end with weights equal (bit for bit) to an uninterrupted run's. The agent is
    torchrun's own, with its ranks forked with torch imported
    (``labkit.torchrun_preloaded``), so an attempt answers in seconds on a loaded
    machine; ``timed_restart`` then times a restart under the real torchrun.
    """
    name = "elastic_restart"
    prerequisite(snapshot_path)   # 9.1's snapshot functions, which it imports: passed
    module = load_program(path)
    _check_latest(name, module)
    weights, summary = _run_killed(name, path, steps, timeout, elastic.PRELOADED,
                                   stacks=False)
    want = _uninterrupted_weights(name, steps)
    differ = [k for k in want if not torch.equal(want[k], weights[k])]
    if differ:
        raise ExerciseFailed(_(
            "{name}: resumed at step {kill_at}, but the final {param} differs "
            "from the uninterrupted run's: train in exactly the loop of exercise 9.1 "
            "(batches from the resumed step, one train_step per batch, a snapshot "
            "after every cfg.every steps).").format(name=name, kill_at=KILL_AT,
                                                    param=differ[0]))
    passed(name, _("rank 1 SIGKILLed at step {kill_at}; torchrun restarted the group "
                   "({restarts} restart), both ranks resumed at step "
                   "{kill_at}, and the final weights equal the uninterrupted run's "
                   "bit for bit. Not checked here: several nodes (one node, one file "
                   "system: a folder only rank 0's node can see would pass).").format(
                       kill_at=KILL_AT, restarts=summary["restarts"]))
    return summary


def timed_restart(path="elastic_train.py", steps: int = 24,
                  timeout: float = 150.0) -> dict:
    """Run the script under the real ``torchrun --max-restarts=3``, SIGKILL rank 1 at
    step 12, and return what happened and how long the restart took.

    Not a check (``elastic_restart`` is): the measurement of section 2, every rank a
    new Python that imports torch, as on a cluster. Each rank's stack while it held
    (SIGUSR1) is in ``stacks``; the agent's lines about the failure in
    ``agent_lines``; seconds from the kill until both ranks trained again in
    ``restart_seconds``.
    """
    return _run_killed("timed_restart", path, steps, timeout, elastic.TORCHRUN,
                       stacks=True)[1]


# ---------------------------------------------------------------- exercise 9.3


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
COLLECTIVE_OF_RANK = {0: "all_reduce", 1: "broadcast"}   # where each rank hangs


def _blocked_at(text: str, module) -> tuple[int | None, list[str]]:
    """Read a rank's dump: the line of ``steps`` the rank was blocked on, and the
    learner's frames of other threads.

    The rank runs ``module.steps`` in its main thread; that thread's innermost frame
    in the learner's file is where the rank was (None: the dump has no such thread).
    """
    own, others = os.path.realpath(module.__file__), []
    for block in text.split("\n\n"):
        frames = [(int(line), func) for path, line, func in _FRAME.findall(block)
                  if os.path.realpath(path) == own]
        if any(func == module.steps.__name__ for _line, func in frames):
            return frames[0][0], others
        others += [f"{os.path.basename(own)}:{line} in {func}"
                   for line, func in frames]
    return None, others


def _hang_hint(name: str, rank: int, text: str, module, waited: float) -> str | None:
    """Say why a rank's dump does not show the collective it was blocked on."""
    line, others = _blocked_at(text, module)
    filename = os.path.basename(module.__file__)
    if line is None and others:
        return _("{name}: rank {rank}'s dump shows only the watchdog's own thread "
                 "({where}), not the thread that was blocked in the collective: dump "
                 "every thread (faulthandler.dump_traceback(file, all_threads=True), "
                 "or faulthandler.dump_traceback_later, which always does).").format(
                     name=name, rank=rank, where=others[0])
    if line is None:
        return _("{name}: rank {rank} waited {waited:g} s in a collective, but its "
                 "file holds {text!r}: arm faulthandler.dump_traceback_later("
                 "seconds, file=...) with the file kept open until close().").format(
                     name=name, rank=rank, waited=waited, text=text[:80])
    collective = COLLECTIVE_OF_RANK[rank]
    source = linecache.getline(module.__file__, line).strip()
    if f"{collective}(" not in source:
        return _("{name}: rank {rank} was blocked in dist.{collective}, but its dump "
                 "shows {filename}:{line} ({source!r}) as its innermost line: the "
                 "stack was written at another moment than the hang (while the rank "
                 "waited, the countdown must fire by itself).").format(
                     name=name, rank=rank, collective=collective, filename=filename,
                     line=line, source=source)
    return None


def hang_finder(path="hang_finder.py", seconds: float = 1.5) -> dict:
    """Check the Watchdog: quiet while steps progress, a stack dump per rank on a hang.

    Launches ``steps`` of the module at ``path`` on 2 gloo ranks, healthy (8 steps of
    0.25 s: each a sixth of ``seconds``, all of them together longer) and with a
    mismatched collective at step 3. Returns each rank's dump from the hung run.

    No verdict rests on this machine's speed: the sleeps make the healthy run last
    at least 2 s (so a countdown never re-armed always fires), and a correct
    watchdog dumps only if one step takes six times its sleep.
    """
    name = "hang_finder"
    module = load_program(path)
    folder = tempfile.mkdtemp(prefix="labkit-hang-check-")
    try:
        launch_program(name, module.steps, 2, args=(folder, 8, seconds, None, 0.25),
                       timeout=10, hang_hint=_("A healthy run must not hang."))
        noisy = [r for r in range(2) if Path(folder, f"rank{r}.txt").read_text()]
        if noisy:
            raise ExerciseFailed(_(
                "{name}: in a healthy run of 8 steps of 0.25 s, rank(s) {noisy} "
                "dumped their stacks although no step took {seconds} s: re-arm the "
                "countdown in pet() (faulthandler.dump_traceback_later again), and "
                "cancel it in close().").format(name=name, noisy=noisy,
                                                seconds=seconds))
        launch_program(name, module.steps, 2, args=(folder, 8, seconds, 3, 0.0),
                       timeout=3 * seconds, hang_hint=_("The watchdog must not block."))
        dumps = {r: Path(folder, f"rank{r}.txt").read_text() for r in range(2)}
    finally:
        shutil.rmtree(folder)
    for rank, text in dumps.items():
        hint = _hang_hint(name, rank, text, module, 3 * seconds)
        if hint:
            raise ExerciseFailed(hint)
    where = {r: f"{os.path.basename(module.__file__)}:{_blocked_at(t, module)[0]}"
             for r, t in dumps.items()}
    passed(name, _("quiet while healthy; on the hang rank 0 was at {where0} "
                   "(all_reduce), rank 1 at {where1} (broadcast).").format(
                       where0=where[0], where1=where[1]))
    return dumps
