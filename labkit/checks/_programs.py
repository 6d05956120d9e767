"""What every *program* check shares: load the learner's module afresh, launch it on
ranks, and turn what goes wrong into a hint.

A program exercise is a cell that starts with ``%%writefile my_module.py``; the
learner's code lives in function bodies between the solution markers. The check
right after it calls ``load_program("my_module.py")`` (a fresh import, so an edited
file is always picked up) and ``launch_program(...)``, which runs a function of that
module on N ranks with ``labkit.launch`` and converts the launcher's errors:

- a rank that hits the stub's ``NotImplementedError`` -> "not done yet";
- a collective that never completes -> the ranks that waited, and the usual causes;
- any other exception -> the rank, the exception and the learner's own line.

Checks then compare what the ranks returned with a reference and name the classic
mistake that explains the difference (``mistake``).
"""

import importlib
import linecache
import re
import subprocess
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

from labkit import _spawn, crowding, launch
from labkit.checks._core import ExerciseFailed
from labkit.messages import N_, _

__all__ = ["load_program", "launch_program", "launch_programs", "run_command",
           "first_difference", "torch_refused", "one_thread"]

IN_YOUR_CODE = N_("\nIn your code:\n{where}")   # the learner's lines of a traceback


def load_program(path) -> object:
    """Import the module the learner wrote to ``path`` afresh and return it.

    The module's folder goes to the front of ``sys.path``, so ranks import the same
    file. Errors become ``ExerciseFailed`` that say which cell to run or fix.
    """
    path = Path(path)
    if not path.exists():
        raise ExerciseFailed(_(
            "{path} does not exist yet: run the `%%writefile {filename}` cell above "
            "first (it writes the file), then this one.").format(path=path,
                                                                 filename=path.name))
    folder, name = str(path.resolve().parent), path.stem
    if sys.path[0] != folder:
        sys.path.insert(0, folder)
    sys.modules.pop(name, None)   # an edited file must be imported again
    linecache.checkcache(str(path))
    importlib.invalidate_caches()
    try:
        return importlib.import_module(name)
    except NotImplementedError:
        raise ExerciseFailed(_("{filename}: not done yet. Replace `raise "
                               "NotImplementedError()` with your code.").format(
                                   filename=path.name)) from None
    except Exception as err:   # SyntaxError, NameError at import: say where
        raise ExerciseFailed(_(
            "{filename} does not import: {error_type}: {error}. Fix the "
            "`%%writefile {filename}` cell and run it again.").format(
                filename=path.name, error_type=type(err).__name__,
                error=err)) from None


def _is_stub(traceback_text: str) -> bool:
    """Tell whether a rank stopped at the stub's bare ``raise NotImplementedError()``.

    torch raises NotImplementedError *with a message* for unsupported operations
    (a DTensor passed to ``dist.all_reduce``): that is a mistake, not a stub.
    """
    last = traceback_text.strip().splitlines()[-1].strip()
    return last == "NotImplementedError"


def _learner_lines(traceback_text: str, filename: str) -> str:
    """Return the traceback lines that point into the learner's file."""
    lines = traceback_text.splitlines()
    keep = []
    for i, line in enumerate(lines):
        if f"{filename}\"" in line:
            keep.append(line.strip())
            if i + 1 < len(lines):
                keep.append("    " + lines[i + 1].strip())
    return "\n".join(keep[-4:])


def launch_program(exercise: str, worker, world_size: int = 2, args: tuple = (),
                   timeout: float = 30.0, hang_hint: str = "", explain=None,
                   module: str | None = None, **kwargs) -> list:
    """Run ``worker`` (a function of the learner's module) on ranks; return results.

    ``hang_hint`` is added when a collective times out: name the likely mistake
    (a rank that skips a send, a barrier on one rank only, ...). ``explain(text)``
    may turn a rank's traceback into the hint for a classic mistake (None: no idea).
    ``module`` names the learner's module when ``worker`` is a labkit harness that
    imports it in the rank. The backend is gloo unless given, so a check runs the
    same on any machine. On an overloaded machine the timeout is stretched
    (``crowding.patience``): a check's verdict must not depend on the crowd.
    """
    kwargs.setdefault("backend", "gloo")
    timeout = crowding.patience(timeout)   # a crowded machine is slow, not wrong
    with _verdicts(exercise, f"{module or worker.__module__}.py", timeout, hang_hint,
                   explain):
        return launch.run(worker, world_size, args=args, timeout=timeout, **kwargs)


def launch_programs(exercise: str, worker, jobs: list, timeout: float = 30.0,
                    hang_hint: str = "", explain=None, module: str | None = None,
                    names: list | None = None, **kwargs) -> list:
    """``launch_program`` for several jobs at once, ``(world_size, args)`` each
    (``launch.run_concurrently``); return each job's rank results. A failure names
    its job by ``names[job]`` when given."""
    kwargs.setdefault("backend", "gloo")
    timeout = crowding.patience(timeout)
    with _verdicts(exercise, f"{module or worker.__module__}.py", timeout, hang_hint,
                   explain, names):
        return launch.run_concurrently([(worker, n, args) for n, args in jobs],
                                       timeout=timeout, **kwargs)


@contextmanager
def _verdicts(exercise: str, filename: str, timeout: float, hang_hint: str, explain,
              names: list | None = None):
    """Turn a launch's failure into the learner's verdict (``launch_program``)."""
    try:
        yield
    except (launch.WorkerError, launch.CollectiveTimeout,
            launch.DeadlineExceeded) as err:
        job = getattr(err, "job", None)
        if names is not None and job is not None:
            exercise = f"{exercise} ({names[job]})"
        if isinstance(err, launch.WorkerError):
            _raise_worker_error(err, exercise, filename, explain)
        raise ExerciseFailed(_(
            "{exercise}: rank(s) {ranks} waited more than {timeout:g} s for the "
            "others: some rank called a collective (or send/recv) that the others "
            "never matched. {hint}").format(exercise=exercise, ranks=err.ranks,
                                            timeout=timeout,
                                            hint=hang_hint).rstrip()
            + crowding.overload_note()) from None   # the crowd may be the cause


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(: |:?$)")


def exception_text(traceback_text: str) -> str:
    """The exception a traceback ends with, on one line: ``Type: message``, with a
    message torch spreads over several indented lines joined up."""
    lines = traceback_text.strip().splitlines()
    start = next((i for i in range(len(lines) - 1, -1, -1)
                  if _EXCEPTION_LINE.match(lines[i])), len(lines) - 1)
    return " ".join(line.strip() for line in lines[start:] if line.strip())


def _raise_worker_error(err, exercise: str, filename: str, explain) -> None:
    """Turn a rank's exception into the learner's verdict: not done, or where and why."""
    if _is_stub(err.traceback):
        raise ExerciseFailed(_(
            "{exercise}: not done yet (rank {rank} reached `raise "
            "NotImplementedError()` in {filename}). Write that function body, "
            "run its cell, then this one.").format(
                exercise=exercise, rank=err.rank, filename=filename)) from None
    last = exception_text(err.traceback)
    where = _learner_lines(err.traceback, filename)
    hint = explain(err.traceback) if explain else None
    raise ExerciseFailed(
        _("{exercise}: rank {rank} raised {last}").format(
            exercise=exercise, rank=err.rank, last=last)
        + (_(IN_YOUR_CODE).format(where=where) if where else "")
        + (f"\n{hint}" if hint else "")) from None


def first_difference(want: dict, got: dict, atol: float) -> tuple | None:
    """Return (name, max |difference|) of the first tensor off by more than ``atol``.

    ``want`` and ``got`` map names to tensors (parameters, gradients); a name only
    one side has counts as a difference of ``inf``. None when all agree.
    """
    for name in want:
        if name not in got:
            return name, float("inf")
        gap = (want[name].double() - got[name].detach().cpu().double()).abs().max()
        if gap.item() > atol:
            return name, gap.item()
    extra = sorted(set(got) - set(want))
    return (extra[0], float("inf")) if extra else None


def run_command(command: list, timeout: float, busy_extra: float = 0.0,
                **kwargs) -> subprocess.CompletedProcess:
    """Run a command (e.g. torchrun) in a session of its own; capture its output.

    If it is still running after ``timeout`` s while the machine is overloaded
    (``crowding``), it gets up to ``busy_extra`` s more, and a line says so: a crowded
    classroom server is slow, and a slow machine is no mistake of the learner's.
    On a timeout, an interrupt of the cell or any error, the command and every
    process below it are killed: torchrun's ranks never outlive the check. A timeout
    raises ``subprocess.TimeoutExpired`` as ``subprocess.run`` would.
    """
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True, **kwargs)
    try:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            busy = crowding.now()
            if not (busy_extra > 0 and busy.overloaded):
                raise
            print(_("[check] still running after {timeout:g} s on a busy machine "
                    "({machine}): waiting up to {extra:g} s more.").format(
                        timeout=timeout, machine=busy.describe(), extra=busy_extra),
                  flush=True)
            out, err = process.communicate(timeout=busy_extra)
    except BaseException:   # TimeoutExpired, KeyboardInterrupt, ...
        _spawn.stop_tree(process)   # torchrun's ranks live in sessions of their own
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def torch_refused(err: BaseException, module_name: str) -> RuntimeError:
    """A RuntimeError that says torch refused an operation, at the learner's line.

    Taught in: labs 08 and 10 (DTensor raises NotImplementedError with a message for
    an operation it has no rule for: not the stub, whose message is empty). The line
    is the last frame of ``err``'s traceback in the learner's module ``module_name``.
    """
    mine = [_("{file}, line {lineno}: {code}").format(
                file=Path(f.filename).name, lineno=f.lineno, code=f.line)
            for f in traceback.extract_tb(err.__traceback__)
            if Path(f.filename).stem == module_name]
    return RuntimeError(_("torch refused an operation: {error} (at {where})").format(
        error=err, where=mine[-1] if mine else module_name))


@contextmanager
def one_thread():
    """Run a check's own reference computation on one thread, then restore the count.

    Usable as a decorator. A reference is what N one-thread ranks must equal, and on
    a loaded machine (other learners, the check's own ranks) a second OpenMP thread
    has no core of its own: it spins while it waits. Measured on 2 busy cores, lab
    03's one-process reference took 0.9 CPU-s on one thread and 6.5 on two (4 s of
    wall time against 45).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
