"""``labkit bench launch``: what starting ranks from a notebook costs.

Taught in: lab 03 (the launcher). Compares call-to-every-rank-ready of a 2-rank gloo
launch with a bare ``python -c "import torch"``. Last line:
``launch vs import torch: <ratio>x``.
"""

import os
import statistics
import subprocess
import sys
import time

from labkit import launch

__all__ = ["time_to_ready", "launch_cost"]


def time_to_ready(ctx) -> float:
    """Return the wall-clock time at which this rank's process group was up."""
    return time.time()


def _import_torch_seconds() -> float:
    """Time a fresh ``python -c "import torch"``, the floor any launch pays once."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - start


def _launch_seconds(world_size: int) -> float:
    """Time from calling ``launch.run`` to the last rank having its group up."""
    start = time.time()
    ready = launch.run(time_to_ready, world_size=world_size, backend="gloo")
    return max(ready) - start


def launch_cost(world_size: int = 2, repeats: int = 3) -> float:
    """Compare launch-to-ready of a gloo launch with a bare ``import torch``, same run.

    The first launch in a Python starts the forkserver (which imports torch and
    DDP's dependencies once); later launches fork ranks from it. The headline uses
    the first, slower one.
    """
    method = os.environ.get("LABKIT_START_METHOD", "forkserver")
    print(f"Start method: {method}. Timing `python -c 'import torch'` (best of 2)...")
    bare = min(_import_torch_seconds() for _ in range(2))
    print(f"import torch in a fresh Python: {bare:.2f} s")
    first = _launch_seconds(world_size)
    again = statistics.median(_launch_seconds(world_size) for _ in range(repeats))
    print(f"{world_size}-rank gloo launch, the first in this Python: {first:.2f} s "
          "until every rank is ready")
    print(f"{world_size}-rank gloo launch, the next ones (median of {repeats}): "
          f"{again:.2f} s ({again / bare:.2f}x import torch)")
    ratio = first / bare
    print(f"launch vs import torch: {ratio:.2f}x")
    return ratio
