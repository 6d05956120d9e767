"""``labkit bench launch``: what starting ranks from a notebook costs.

Taught in: lab 03 (the launcher). Compares call-to-every-rank-ready of the first 2-rank
gloo launch in a Python (it starts the forkserver, which imports torch and DDP's
dependencies once) with a bare ``python -c "import torch"``. Each pair runs both in
fresh Pythons, in turn, so that both meet the same load. Last line:
``launch vs import torch: <median>x (<min>–<max>x over <n> pairs)``.
"""

import json
import os
import statistics
import subprocess
import sys
import time

from labkit.bench import Ratios, alternate

__all__ = ["time_to_ready", "launch_cost"]

# Run in a fresh Python: time the first launch (after importing labkit, which the
# notebook has done by then), then a second one; print both as JSON.
_FIRST_LAUNCH = """
import json, sys, time
from labkit import launch
from labkit.labs.ddp.bench_launch_cost import time_to_ready
times = []
for _ in range(2):
    start = time.time()
    ready = launch.run(time_to_ready, world_size=int(sys.argv[1]), backend="gloo")
    times.append(max(ready) - start)
print(json.dumps(times))
"""


def time_to_ready(ctx) -> float:
    """Return the wall-clock time at which this rank's process group was up."""
    return time.time()


def _import_torch_seconds() -> float:
    """Time a fresh ``python -c "import torch"``, the floor any launch pays once."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - start


def _launch_seconds(world_size: int) -> tuple[float, float]:
    """In a fresh Python: (first launch to every rank ready, the next launch) in s."""
    done = subprocess.run([sys.executable, "-c", _FIRST_LAUNCH, str(world_size)],
                          check=True, capture_output=True, text=True, timeout=300)
    first, again = json.loads(done.stdout.strip().splitlines()[-1])
    return first, again


def launch_cost(world_size: int = 2, pairs: int = 4) -> float:
    """Compare the first gloo launch in a Python with a bare ``import torch``.

    ``pairs`` times: a fresh ``import torch``, then a fresh Python's first launch
    (and its second, for the line about later launches). Returns the median ratio.
    """
    method = os.environ.get("LABKIT_START_METHOD", "forkserver")
    print(f"Start method: {method}. {pairs} pairs, in turn: a fresh `python -c "
          f"'import torch'`, then a fresh Python's first {world_size}-rank gloo launch "
          "(call to every rank ready).")
    bare, launched = alternate(_import_torch_seconds,
                               lambda: _launch_seconds(world_size), pairs)
    first = [f for f, _ in launched]
    print("import torch in a fresh Python, s: " + ", ".join(f"{t:.2f}" for t in bare))
    print(f"first {world_size}-rank gloo launch in a Python, s: "
          + ", ".join(f"{t:.2f}" for t in first))
    print(f"the launch after it (forkserver running), median: "
          f"{statistics.median(a for _, a in launched):.2f} s")
    ratios = Ratios(tuple(f / b for f, b in zip(first, bare)), null=1.0, digits=2)
    note = ratios.noise_note("what a launch costs beyond one import of torch")
    if note:
        print(note)
    print(ratios.headline("launch vs import torch"))
    return ratios.median
