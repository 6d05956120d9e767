"""Lab 03's two-node ``torchrun`` command, run for real on two namespace nodes.

Taught in: lab 03, appendix A (``ddp_two_nodes``: one ``torchrun`` per node, the
weights compared bit for bit with a single-node run). Needs root
(``labkit.cluster.unavailable()`` says why not).
"""

import os
import subprocess
import tempfile
import time
from pathlib import Path

from labkit import cluster
from labkit.multinode import (check, run_together, torchrun, torchrun_command)

__all__ = ["ddp_two_nodes"]


def ddp_two_nodes(script="ddp_script.py", epochs: int = 1, limit: int = 512,
                  folder=None, reference=None, profile="1gbe",
                  timeout: float = 240.0) -> dict:
    """Run lab 03's two-node torchrun command for real, one torchrun per node.

    ``torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d
    --rdzv-endpoint=node0:29400 --rdzv-id=job42 SCRIPT OUT EPOCHS LIMIT`` in node0
    and in node1 at once (``node0`` resolves to node0's address inside every node,
    as on a cluster with DNS). The nodes are CPU nodes (gloo). Then compares the
    weights with ``reference`` (a file a single-node ``--standalone
    --nproc-per-node=2`` run on CPU ranks saved), running that command itself, on
    CPU ranks, when ``reference`` is None. Returns the command, both outputs, the
    weight comparison and the time.
    """
    import torch

    script = Path(script).resolve()
    folder = Path(folder or tempfile.mkdtemp(prefix="lab03_nodes_"))
    out = folder / "two_node_weights.pt"
    command = torchrun_command([script.name, out, epochs, limit])
    with cluster.Cluster(2, profile, verbose=False) as box:
        link = box.describe()
        start = time.monotonic()
        runs = run_together(box, {n: command for n in box.nodes}, cwd=script.parent,
                            timeout=timeout)
        seconds = time.monotonic() - start
    check(runs, "the two-node torchrun")
    if reference is None:
        reference = folder / "single_node_weights.pt"
        done = subprocess.run([torchrun(), "--standalone", "--nproc-per-node=2",
                               script.name, reference, str(epochs), str(limit)],
                              cwd=script.parent, capture_output=True, text=True,
                              timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": "1",
                                   "CUDA_VISIBLE_DEVICES": ""})   # gloo, as the nodes
        if done.returncode != 0:
            raise cluster.ClusterError(f"the single-node run failed:\n"
                                       f"{(done.stdout + done.stderr)[-3000:]}")
    two = torch.load(out, weights_only=True)
    one = torch.load(reference, weights_only=True)
    gap = max((two[k] - one[k]).abs().max().item() for k in one)
    return {"command": " ".join(["torchrun", *command[1:]]), "link": link,
            "outputs": {n: r.output for n, r in runs.items()}, "seconds": seconds,
            "equal": all(torch.equal(two[k], one[k]) for k in one) and
            set(one) == set(two), "max_diff": gap, "weights": str(out),
            "reference": str(reference)}

