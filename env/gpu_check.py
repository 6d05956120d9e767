"""Run every solution notebook under nbval on this machine and print one summary table.

Made for a machine with one or more GPUs (the GPU lane, a classroom server before the
course starts); on a CPU-only machine it runs the CPU-OK notebooks and marks the others
skipped, with the reason. Per notebook: pass/fail/skip, seconds, the backend its setup
cell chose and every backend and device its jobs really ran on.

    python env/gpu_check.py                       # every solutions/*.ipynb
    python env/gpu_check.py solutions/01_*.ipynb   # some of them
    LABKIT_QUICK=0 python env/gpu_check.py         # full mode (default: quick mode)
    python env/gpu_check.py --workdir /tmp/course --gpu-tests --lab01-full \\
        --json gpu-check.json                      # what the GPU lane runs

``--workdir`` first copies the checkout there and runs the copy: notebooks write
files next to themselves (``%%writefile``), so a read-only checkout would fail them.
``--gpu-tests`` adds a row for ``pytest -m gpu tests`` (with ``LABKIT_REQUIRE_GPU`` as
set: the lane declares its GPUs). ``--lab01-full`` adds lab 01 in full mode and the
time its recipe takes to reach 99 % test accuracy on this machine's first device.

The "backend" column is what the notebook's ``labkit.begin`` chose (read from
``LABKIT_CHOICE_LOG``; for a skipped notebook, what ``labkit.hardware.choose`` would
pick for its ``metadata.labkit.world_size``). "jobs" lists the launches by backend and
devices. A notebook whose setup, or a job left to labkit's choice, ran gloo with a GPU
for every rank fails (``backend_problems``: NCCL should have run it). Exit status: 0
when nothing failed, 1 otherwise.
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = Path("tests") / "nbval_sanitize.cfg"
COPY_IGNORE = (".git", ".venv", "__pycache__", ".ipynb_checkpoints", "artifacts",
               "*.egg-info", "build")


@dataclass
class Result:
    """One row of the table."""

    notebook: str
    status: str        # "pass", "fail" or "skip"
    seconds: float
    backend: str       # e.g. "nccl/cuda x2": what the lab's setup chose
    note: str = ""
    jobs: str = "-"    # e.g. "nccl cuda:0,cuda:1 x7; gloo cpu x4 x1"
    choices: tuple = ()   # every record of LABKIT_CHOICE_LOG, as dicts


def backend_for(world_size: int) -> str:
    """Return what labkit chooses here for ``world_size`` ranks, e.g. 'nccl/cuda x2'."""
    from labkit import hardware

    setup = hardware.choose(world_size, verbose=False)
    return f"{setup.backend}/{setup.device_type} x{setup.world_size}"


def nbval_command(path: Path, cell_timeout: int, root: Path = ROOT) -> list:
    """Return the pytest command that runs one notebook like `make test` does."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--nbval-lax", "--nbval-current-env",
               f"--nbval-cell-timeout={cell_timeout}", str(path)]
    if (root / SANITIZE).exists():
        command[-1:-1] = ["--nbval-sanitize-with", str(root / SANITIZE)]
    return command


def summarize(choices: list) -> tuple[str | None, str]:
    """Return (the lab's backend, the jobs by backend and devices) from the log."""
    begun = [c for c in choices if c["where"] == "begin"]
    lab = (f"{begun[0]['backend']}/{begun[0]['device_type']} x{begun[0]['world_size']}"
           if begun else None)
    jobs = collections.Counter(f"{c['backend']} {c['devices']}" for c in choices
                               if c["where"] != "begin")
    text = "; ".join(f"{job} x{count}" for job, count in jobs.items()) or "-"
    return lab, text


def backend_problems(choices: list, found: int) -> list[str]:
    """Say where a run took gloo although NCCL could have run it: a silent fall-back.

    A choice left to labkit ("auto") takes NCCL whenever there is a GPU per rank, so
    gloo there means NCCL failed to show up (a CPU build of torch, no NCCL). The
    lab's own setup (``labkit.begin``) is judged against the GPUs this lane sees,
    a job against the GPUs its process saw (the cluster's nodes and lab 03's check
    hide them on purpose). A job that asked for gloo (the checks' CPU ranks) is
    not a fall-back.
    """
    problems = []
    for choice in choices:
        if choice["backend"] != "gloo" or choice.get("asked", "auto") != "auto":
            continue
        begin = choice["where"] == "begin"
        visible = found if begin else choice.get("gpus", 0)
        if choice["world_size"] <= visible:
            what = "labkit.begin" if begin else choice["what"] or choice["where"]
            problems.append(f"{what} ran gloo for {choice['world_size']} rank(s) with "
                            f"{visible} GPU(s) visible: NCCL should have run it")
    return problems


def _run_logged(command: list, cwd: Path, env: dict) -> tuple:
    """Run ``command`` with a fresh choice log; return (process, seconds, choices)."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        log = Path(folder) / "choices.jsonl"
        start = time.perf_counter()
        done = subprocess.run(command, cwd=cwd, text=True, capture_output=True,
                              env={**os.environ, "MPLBACKEND": "agg",
                                   "LABKIT_CHOICE_LOG": str(log), **env})
        seconds = time.perf_counter() - start
        choices = ([json.loads(line) for line in log.read_text().splitlines()]
                   if log.exists() else [])
    return done, seconds, choices


def _report_failure(name: str, done) -> None:
    sys.stderr.write(f"\n===== {name} failed =====\n{done.stdout[-6000:]}"
                     f"{done.stderr[-2000:]}\n")


def run_one(path: Path, found: int, cell_timeout: int, root: Path = ROOT,
            env: dict | None = None, label: str | None = None) -> Result:
    """Run one notebook under nbval (or skip it); time it and read what it chose."""
    from coursetools.notebooks import hardware_needs, hardware_skip_reason

    name = label or path.name
    predicted = backend_for(hardware_needs(path)["world_size"])
    reason = hardware_skip_reason(path, found)
    if reason:
        return Result(name, "skip", 0.0, predicted, reason)
    done, seconds, choices = _run_logged(nbval_command(path, cell_timeout, root), root,
                                         env or {})
    problems = backend_problems(choices, found)
    if done.returncode != 0:
        _report_failure(name, done)
    for problem in problems:
        sys.stderr.write(f"\n===== {name}: {problem} =====\n")
    lab, jobs = summarize(choices)
    lines = done.stdout.strip().splitlines() or [""]
    failed = done.returncode != 0 or problems
    return Result(name, "fail" if failed else "pass", seconds, lab or predicted,
                  "; ".join(problems) or lines[-1], jobs, tuple(choices))


def run_gpu_tests(root: Path, found: int = 0) -> Result:
    """Run ``pytest -m gpu tests``: one row (a skip the lane can run fails it, and
    so does a job that fell back to gloo)."""
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
               "-m", "gpu", "tests"]
    done, seconds, choices = _run_logged(command, root, {})
    problems = backend_problems(choices, found)
    status = "pass" if done.returncode == 0 and not problems else "fail"
    if done.returncode == 5:   # no test collected: nothing is marked gpu
        status = "skip"
    elif done.returncode != 0:
        _report_failure("pytest -m gpu", done)
    lines = done.stdout.strip().splitlines() or [""]
    declared = os.environ.get("LABKIT_REQUIRE_GPU", "0") or "0"
    return Result("pytest -m gpu tests", status, seconds, f"lane declares {declared}",
                  "; ".join(problems) or lines[-1], summarize(choices)[1],
                  tuple(choices))


def time_to_99(target: float = 0.99, epochs: int = 3, batch_size: int = 128,
               limit: int | None = None) -> dict:
    """Train lab 01's recipe on this machine's first device; time it to ``target``.

    The recipe of lab 01 section 5: the device-resident MNIST fast path, small_cnn,
    Adam 1e-3 with a one-cycle schedule (max 1e-2) over 3 epochs of batch 128, seed 0;
    test accuracy after each epoch. Only training time counts (evaluation excluded).
    ``limit`` keeps that many images of each split (tests; None: all of them).
    """
    import torch

    from labkit import data, models, train

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_data = data.DeviceData.mnist(train=True, device=device, limit=limit)
    test_data = data.DeviceData.mnist(train=False, device=device, limit=limit)
    torch.manual_seed(0)
    model = models.small_cnn().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = -(-len(train_data) // batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2,
                                                    total_steps=epochs * steps)
    seconds, accuracies, reached = 0.0, [], None
    for epoch in range(epochs):
        train.synchronize(device)
        start = time.perf_counter()
        for images, labels in train_data.batches(batch_size):
            train.train_step(model, images, labels, optimizer)
            scheduler.step()
        train.synchronize(device)
        seconds += time.perf_counter() - start
        accuracies.append(train.evaluate(model, test_data.batches(1000, shuffle=False)))
        if reached is None and accuracies[-1] >= target:
            reached = {"epoch": epoch + 1, "seconds": seconds}
    return {"device": str(device), "accuracies": accuracies, "seconds": seconds,
            "reached": reached, "target": target}


def lab01_full(root: Path, found: int, cell_timeout: int) -> tuple[Result, dict]:
    """Lab 01 in full mode under nbval, and its recipe's time to 99 %."""
    path = next(iter(sorted((root / "solutions").glob("01_*.ipynb"))), None)
    if path is None:
        return Result("lab 01 (full mode)", "skip", 0.0, "-", "no solutions/01_*"), {}
    result = run_one(path, found, cell_timeout, root, {"LABKIT_QUICK": "0"},
                     label=f"{path.name} (full mode)")
    timing = time_to_99()
    return result, timing


def describe_time_to_99(timing: dict) -> str:
    """One line: when lab 01's recipe reached 99 %, or that it did not."""
    final = f"final {timing['accuracies'][-1]:.2%}"
    if timing["reached"] is None:
        return (f"lab 01 recipe on {timing['device']}: did NOT reach "
                f"{timing['target']:.0%} in {len(timing['accuracies'])} epochs "
                f"({final}, {timing['seconds']:.1f} s of training)")
    return (f"lab 01 recipe on {timing['device']}: {timing['target']:.0%} after epoch "
            f"{timing['reached']['epoch']}, {timing['reached']['seconds']:.1f} s of "
            f"training ({final} after {len(timing['accuracies'])} epochs, "
            f"{timing['seconds']:.1f} s)")


def table(results: list) -> str:
    """Format the results as a fixed-width text table."""
    rows = [("notebook", "result", "seconds", "backend", "jobs", "note")]
    rows += [(r.notebook, r.status.upper(), f"{r.seconds:.1f}", r.backend, r.jobs,
              r.note) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[5]
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def expected_time(paths: list, quick: bool, lab01_full: bool = False) -> str:
    """One line: the lane's time from the notebooks' measured times, and what is
    missing (``labkit measure-labs --quick`` records them in metadata.labkit.measured;
    they were measured on another machine, the line says which)."""
    key = "quick_mode_s" if quick else "full_mode_s"
    seconds, missing, where = 0.0, [], set()
    runs = [(Path(p), key) for p in paths]
    if lab01_full:
        runs += [(p, "full_mode_s") for p in map(Path, paths) if p.name[:3] == "01_"]
    for path, field in runs:
        measured = json.loads(path.read_text())["metadata"].get("labkit", {}).get(
            "measured") or {}
        if measured.get(field) is None:
            missing.append(path.name)
            continue
        seconds += measured[field]
        where.add(f"{measured['on']}, {measured['date']}")
    mode = "quick" if quick else "full"
    line = (f"expected: about {seconds / 60:.0f} min for the notebooks ({mode} mode"
            + (", lab 01 in full" if lab01_full else "")
            + f"), as measured on {'; '.join(sorted(where)) or 'no machine yet'}")
    if missing:
        line += f"; not measured: {', '.join(missing)}"
    return line + "; pytest -m gpu and lab 01's 99 % run not included"


def writable_copy(workdir: Path) -> Path:
    """Copy the checkout to ``workdir`` (new or empty) and return it."""
    if workdir.exists() and any(workdir.iterdir()):
        raise SystemExit(f"--workdir {workdir} is not empty: give a new folder")
    shutil.copytree(ROOT, workdir, dirs_exist_ok=True, symlinks=True,
                    ignore=shutil.ignore_patterns(*COPY_IGNORE))
    return workdir


def _notebook_paths(paths: list, root: Path) -> list:
    """Map the notebooks asked for (in the checkout) to the copy under ``root``."""
    mapped = []
    for path in paths:
        path = Path(path).resolve()
        try:
            mapped.append(root / path.relative_to(ROOT))
        except ValueError:   # outside the checkout: run it where it is
            mapped.append(path)
    return mapped


def _use_the_checkouts_tooling() -> None:
    """Make the checkout's course tooling importable here and in the nbval runs: the
    course image (where the GPU lane runs this) installs labkit alone, and the test
    collector reads the notebooks' hardware rule from ``coursetools.notebooks``."""
    try:
        import coursetools  # noqa: F401
    except ImportError:
        tooling = str(ROOT / "tooling")
        sys.path.insert(0, tooling)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (tooling, os.environ.get("PYTHONPATH")) if p)


def main(argv=None) -> int:
    """Parse arguments, run the notebooks, print the hardware and the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        default=sorted((ROOT / "solutions").glob("*.ipynb")))
    parser.add_argument("--cell-timeout", type=int, default=600,
                        help="seconds per cell")
    parser.add_argument("--workdir", type=Path,
                        help="copy the checkout here first and run the copy")
    parser.add_argument("--gpu-tests", action="store_true",
                        help="also run pytest -m gpu tests")
    parser.add_argument("--lab01-full", action="store_true",
                        help="also run lab 01 in full mode, and time it to 99 %%")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    _use_the_checkouts_tooling()
    os.environ.setdefault("LABKIT_QUICK", "1")
    os.environ.setdefault("LABKIT_OFFLINE", "1")
    import torch

    root = writable_copy(args.workdir) if args.workdir else ROOT
    found = torch.cuda.device_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(found)) or "none"
    print(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda or 'none'}); "
          f"{found} GPU(s): {names}; quick mode: {os.environ['LABKIT_QUICK']}; "
          f"running in {root}", flush=True)
    paths = _notebook_paths(args.notebooks, root)
    print(expected_time(paths, os.environ["LABKIT_QUICK"] == "1", args.lab01_full),
          flush=True)
    results, timing = [], {}
    for path in paths:
        print(f"running {path.name} ...", flush=True)
        results.append(run_one(path, found, args.cell_timeout, root))
    if args.gpu_tests:
        print("running pytest -m gpu tests ...", flush=True)
        results.append(run_gpu_tests(root, found))
    if args.lab01_full:
        print("running lab 01 in full mode ...", flush=True)
        result, timing = lab01_full(root, found, args.cell_timeout)
        results.append(result)
    print(table(results))
    if timing:
        print(describe_time_to_99(timing))
    if args.json:
        rows = [{**asdict(r), "choices": list(r.choices)} for r in results]
        args.json.write_text(json.dumps({"gpus": found, "names": names,
                                         "torch": torch.__version__, "rows": rows,
                                         "lab01_time_to_99": timing}, indent=1))
    failed = any(r.status == "fail" for r in results)
    return 1 if failed or (timing and timing["reached"] is None) else 0


if __name__ == "__main__":
    sys.exit(main())
