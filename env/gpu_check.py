"""Run every solution notebook under nbval on this machine and print one summary table.

Made for a machine with one or more GPUs (the GPU lane, a classroom server before the
course starts); on a CPU-only machine it runs the CPU-OK notebooks and marks the others
skipped, with the reason. Per notebook: pass/fail/skip, seconds, backend chosen.

    python env/gpu_check.py                      # every solutions/*.ipynb
    python env/gpu_check.py solutions/01_*.ipynb  # some of them
    LABKIT_QUICK=0 python env/gpu_check.py        # full mode (default: quick mode)

The backend column is what ``labkit.hardware.choose`` picks for the notebook's
``metadata.labkit.world_size`` on this machine, which is what its setup cell uses.
Exit status: 0 when nothing failed, 1 otherwise.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


@dataclass
class Result:
    """One row of the table."""

    notebook: str
    status: str        # "pass", "fail" or "skip"
    seconds: float
    backend: str
    note: str = ""


def backend_for(world_size: int) -> str:
    """Return what labkit chooses here for ``world_size`` ranks, e.g. 'nccl/cuda x2'."""
    from labkit import hardware

    setup = hardware.choose(world_size, verbose=False)
    return f"{setup.backend}/{setup.device_type} x{setup.world_size}"


def nbval_command(path: Path, cell_timeout: int) -> list:
    """Return the pytest command that runs one notebook like `make test` does."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--nbval-lax", "--nbval-current-env",
               f"--nbval-cell-timeout={cell_timeout}", str(path)]
    if SANITIZE.exists():
        command[-1:-1] = ["--nbval-sanitize-with", str(SANITIZE)]
    return command


def run_one(path: Path, found: int, cell_timeout: int) -> Result:
    """Run one notebook under nbval (or skip it) and time it."""
    from labkit.course import hardware_needs, hardware_skip_reason

    backend = backend_for(hardware_needs(path)["world_size"])
    reason = hardware_skip_reason(path, found)
    if reason:
        return Result(path.name, "skip", 0.0, backend, reason)
    start = time.perf_counter()
    done = subprocess.run(nbval_command(path, cell_timeout), cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, "MPLBACKEND": "agg"})
    seconds = time.perf_counter() - start
    lines = (done.stdout.strip().splitlines() or [""])
    if done.returncode != 0:
        sys.stderr.write(f"\n===== {path.name} failed =====\n{done.stdout[-6000:]}"
                         f"{done.stderr[-2000:]}\n")
    status = "pass" if done.returncode == 0 else "fail"
    return Result(path.name, status, seconds, backend, lines[-1])


def table(results: list) -> str:
    """Format the results as a fixed-width text table."""
    rows = [("notebook", "result", "seconds", "backend", "note")]
    rows += [(r.notebook, r.status.upper(), f"{r.seconds:.1f}", r.backend, r.note)
             for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4]
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main(argv=None) -> int:
    """Parse arguments, run the notebooks, print the hardware and the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        default=sorted((ROOT / "solutions").glob("*.ipynb")))
    parser.add_argument("--cell-timeout", type=int, default=600,
                        help="seconds per cell")
    args = parser.parse_args(argv)
    os.environ.setdefault("LABKIT_QUICK", "1")
    os.environ.setdefault("LABKIT_OFFLINE", "1")
    import torch

    found = torch.cuda.device_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(found)) or "none"
    print(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda or 'none'}); "
          f"{found} GPU(s): {names}; quick mode: {os.environ['LABKIT_QUICK']}",
          flush=True)
    results = []
    for path in args.notebooks:
        print(f"running {path.name} ...", flush=True)
        results.append(run_one(path, found, args.cell_timeout))
    print(table(results))
    return 1 if any(r.status == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
