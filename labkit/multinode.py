"""Multi-node for real on one machine: ``torchrun`` on the nodes of a cluster in a box.

Taught in: labs 03, 06 and 09, whose rooms hold what each runs on the nodes
(``labkit.labs.ddp.two_nodes``, ``labkit.labs.communication.real_link``,
``labkit.labs.fault_tolerance.node_faults``). Here is what they share: this
environment's ``torchrun``, lab 03's two-node command, starting one command per node
at once (``run_together``) and failing with every node's log (``check``). The nodes
are ``labkit.cluster``'s network namespaces; everything needs root, and
``labkit.cluster.unavailable()`` says why not.
"""

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from labkit import cluster

__all__ = ["torchrun", "torchrun_command", "run_together", "check", "NodeRun", "popen_logged"]

RDZV_PORT = 29400          # the lab's --rdzv-endpoint=node0:29400
NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}   # lab 09, section 2
# The c10d rendezvous notices a dead node when its keep-alive heartbeat is older than
# keep_alive_interval x keep_alive_max_attempt (5 s x 3 by default: the survivors
# wait 15 s). 1 s x 5 here. Much shorter and a busy agent looks dead: measured with
# 1 s x 2 on 2 loaded cores, the rejoining node formed a world of its own while the
# survivor trained on in another (split brain, both writing snapshots).
# last_call_timeout: how long a round waits for more nodes once MIN have joined.
RDZV_CONF = ("--rdzv-conf=last_call_timeout=1,join_timeout=60,keep_alive_interval=1,"
             "keep_alive_max_attempt=5")


def torchrun() -> str:
    """Return this environment's torchrun (next to the running Python, else PATH)."""
    beside = Path(sys.executable).parent / "torchrun"
    return str(beside) if beside.exists() else (shutil.which("torchrun") or "torchrun")


def torchrun_command(script_and_args, nnodes="2", nproc_per_node: int = 1,
                     endpoint: str = f"node0:{RDZV_PORT}", rdzv_id: str = "job42",
                     extra=()) -> list[str]:
    """Lab 03's two-node command: ``torchrun --nnodes=2 --rdzv-backend=c10d ...``."""
    return [torchrun(), f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={rdzv_id}", *extra, *map(str, script_and_args)]


@dataclass
class NodeRun:
    """One node's command: its exit code, its output (stdout and stderr) and time."""

    node: str
    returncode: int | None
    output: str
    seconds: float


def popen_logged(box, node, argv, env, cwd, log_path):
    with open(log_path, "w") as log:
        return box.popen(node, argv, env=env, cwd=cwd, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)


def run_together(box, commands: dict, env: dict | None = None, cwd=None,
                 timeout: float = 240.0) -> dict:
    """Start each node's command at once (``{node: argv}``); wait for all of them.

    ``env``: added to every node's environment, or ``{node: {...}}`` per node. Each
    node gets a ``TMPDIR`` of its own, removed when the run ends.
    Returns ``{node: NodeRun}``; on timeout every process in the cluster is killed
    and the runs that had not ended have ``returncode`` None.
    """
    per_node = env if env and set(env) <= set(box.nodes) else {
        n: (env or {}) for n in commands}
    start = time.monotonic()
    # Each node's temp files (torchrun's torchelastic_* folders) go to a folder of its
    # own in the run's, removed with it.
    with tempfile.TemporaryDirectory(prefix="labkit-nodes-") as logs:
        for node in commands:
            Path(logs, f"{node}-tmp").mkdir()
        processes = {node: popen_logged(box, node, argv,
                                         {"OMP_NUM_THREADS": "1",
                                          "TMPDIR": str(Path(logs, f"{node}-tmp")),
                                          **per_node.get(node, {})},
                                         cwd, Path(logs, f"{node}.log"))
                     for node, argv in commands.items()}
        ended = {}
        while len(ended) < len(processes) and time.monotonic() - start < timeout:
            for node, process in processes.items():
                if node not in ended and process.poll() is not None:
                    ended[node] = time.monotonic() - start
            time.sleep(0.05)
        for node in processes:
            if node not in ended:
                box.kill_node(node)
        for process in processes.values():
            process.wait()
        return {node: NodeRun(node, p.returncode if node in ended else None,
                              Path(logs, f"{node}.log").read_text(),
                              ended.get(node, time.monotonic() - start))
                for node, p in processes.items()}


def check(runs: dict, what: str) -> None:
    """Raise ``ClusterError`` with every node's log tail unless all exited 0."""
    bad = [r for r in runs.values() if r.returncode != 0]
    if bad:
        logs = "\n".join(f"--- {r.node} (exit {r.returncode}, {r.seconds:.0f} s):\n"
                         f"{r.output[-3000:]}" for r in runs.values())
        raise cluster.ClusterError(f"{what} failed on {', '.join(r.node for r in bad)}"
                                   f":\n{logs}")

