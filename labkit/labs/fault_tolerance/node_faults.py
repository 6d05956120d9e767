"""A node that fails for real: killed or cut off mid-training, the survivors resuming.

Taught in: lab 09, section 2 (``node_failure``: a namespace node killed or its link
pulled, the survivors resuming from their snapshot under ``torchrun --nnodes=1:2
--max-restarts``, the node rejoining). Needs root (``labkit.cluster.unavailable()``).

``python -m labkit.labs.fault_tolerance.node_faults FOLDER STEPS STEP_S`` (what
``node_failure`` starts under torchrun on each node) is an elastic training script
that survives a change of world size: it keeps the global batch (32 images, split
over the ranks), saves ``{model, optimizer, step}`` from rank 0 every 4 steps, and
draws each step's batch from the step number alone, so 2 ranks, 1 rank, and 2 again
train what one process trains (up to float rounding: the gradient is a mean of means).
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit import cluster
from labkit.messages import _
from labkit.multinode import (RDZV_CONF, NO_SHARED_STORE, popen_logged,
                              torchrun_command)

__all__ = ["ElasticConfig", "node_failure", "reference_weights"]


class ElasticConfig:
    """The elastic script's run: the same global batch whatever the world size."""

    global_batch: int = 32
    samples: int = 512
    hidden: int = 64
    lr: float = 0.01
    every: int = 4          # a snapshot after every `every` steps
    seed: int = 0


def _model(cfg: ElasticConfig):
    import torch
    from torch import nn

    torch.manual_seed(cfg.seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, cfg.hidden), nn.ReLU(),
                         nn.Linear(cfg.hidden, 10))


def _global_batch(cfg: ElasticConfig, step: int):
    """The indices of step ``step``'s global batch: from the step number alone."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed * 100_003 + step)
    return torch.randperm(cfg.samples, generator=gen)[:cfg.global_batch]


def reference_weights(steps: int, cfg: ElasticConfig = ElasticConfig()) -> dict:
    """Train the elastic script's run in this one process (no failure): its weights."""
    import torch
    import torch.nn.functional as F

    from labkit import data

    model = _model(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    images, labels = data.random_batch(cfg.samples, cfg.seed + 1)
    for step in range(steps):
        index = _global_batch(cfg, step)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images[index]), labels[index]).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _write_json(path: Path, record: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)          # the parent never reads half a record


def _latest(folder: Path):
    done = sorted(folder.glob("step_*.pt"))     # never a torn *.tmp
    return done[-1] if done else None


def _elastic_main(argv) -> None:
    """The script torchrun runs on every node (``python -m labkit.labs.fault_tolerance.node_faults``)."""
    import socket

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit import data, launch
    from labkit.labs.fault_tolerance import elastic

    folder, steps, step_s = Path(argv[0]), int(argv[1]), float(argv[2])
    timeout = float(os.environ.get("LABKIT_NODE_TIMEOUT", "10"))
    hold_world = int(os.environ.get("LABKIT_HOLD_BELOW_WORLD", "0"))
    cfg = ElasticConfig()
    ctx = launch.init_from_env(backend="gloo", threads_per_rank=1, timeout=timeout)
    if cfg.global_batch % ctx.world_size:
        raise SystemExit(f"global batch {cfg.global_batch} must split over "
                         f"{ctx.world_size} ranks")
    model = DDP(_model(cfg))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    step, latest = 0, _latest(folder)
    if latest is not None:          # every start resumes: the first and each restart
        state = torch.load(latest, map_location="cpu", weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    me = {"rank": ctx.rank, "world_size": ctx.world_size, "node": socket.gethostname(),
          "pid": os.getpid(), "restart": elastic.restart_count()}
    _write_json(folder / f"start.{os.getpid()}.json",
                {**me, "step": step, "time": time.time()})
    images, labels = data.random_batch(cfg.samples, cfg.seed + 1)
    resumed, held = step, False
    while step < steps:
        index = _global_batch(cfg, step)[ctx.rank::ctx.world_size]
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images[index]), labels[index]).backward()
        optimizer.step()
        step += 1
        if step % cfg.every == 0:
            if ctx.rank == 0:
                tmp = folder / f"step_{step:06d}.pt.tmp"
                torch.save({"model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(), "step": step}, tmp)
                os.replace(tmp, folder / f"step_{step:06d}.pt")
            dist.barrier()                  # nobody goes on before the snapshot exists
        _write_json(folder / f"progress.{os.getpid()}.json",
                    {**me, "step": step, "time": time.time()})
        if ctx.world_size < hold_world and step >= resumed + 2 and not held:
            # The survivors wait here for the node to come back (node_failure's
            # rejoin): their agent stops them when it does. Up to 120 s, then on.
            held = True
            end = time.time() + 120
            while time.time() < end and not (folder / "release").exists():
                time.sleep(0.1)
        time.sleep(step_s)
    if ctx.rank == 0:
        weights = model.module.state_dict()
        torch.save({k: v.detach().clone() for k, v in weights.items()},
                   folder / "final.pt")
    dist.destroy_process_group()


def _records(folder: Path, kind: str) -> list[dict]:
    found = []
    for path in folder.glob(f"{kind}.*.json"):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
    return sorted(found, key=lambda r: r["time"])


class _Log:
    """Follow a growing log file from a thread; remember when each line appeared."""

    def __init__(self, path: Path):
        self.path, self.lines, self._stop = path, [], threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self):
        while not self.path.exists() and not self._stop.is_set():
            time.sleep(0.02)
        with open(self.path, errors="replace") as f:
            buffer = ""
            while True:
                chunk = f.read()
                if chunk:
                    buffer += chunk
                    *done, buffer = buffer.split("\n")
                    now = time.time()
                    self.lines.extend((now, line) for line in done)
                elif self._stop.is_set():
                    break
                else:
                    time.sleep(0.02)

    def first(self, words, after: float = 0.0):
        """Return (time, line) of the first line after ``after`` holding a word."""
        return next(((t, line) for t, line in self.lines
                     if t >= after and any(w in line for w in words)), (None, None))

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


# what a survivor's rank prints when its peer is gone (gloo) or silent (timeout)
PEER_ERRORS = ("Connection closed by peer", "Connection reset by peer",
               "Timed out waiting", "timed out", "Connection refused",
               "No route to host", "Network is unreachable")


@dataclass
class Failure:
    """What ``node_failure`` saw, times in seconds from the event."""

    mode: str
    link: str
    kill_step: int | None = None           # the step the survivors had reached
    snapshot_step: int | None = None       # the newest snapshot at the failure
    resumed_step: int | None = None        # where the survivors resumed
    error_line: str | None = None          # the survivor's first error
    error_s: float | None = None           # failure -> that error
    recovery_s: float | None = None        # failure -> survivors training again
    survivor_world: int | None = None
    rejoin_s: float | None = None          # node restarted -> 2 nodes training
    rejoin_world: int | None = None
    rejoin_step: int | None = None
    final_step: int | None = None
    first_step_s: float | None = None      # torchrun started -> first step on 2 nodes
    seconds: float | None = None           # the whole run
    max_diff: float | None = None          # final weights vs the no-failure run
    returncodes: dict = field(default_factory=dict)
    logs: dict = field(default_factory=dict)
    timeline: list = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"{self.mode} node1 at step {self.kill_step} (newest snapshot: step "
                 f"{self.snapshot_step}); link {self.link}"]
        if self.error_s is not None:
            lines.append(f"  survivor's error after {self.error_s:.1f} s: "
                         f"{self.error_line.strip()[:160]}")
        if self.recovery_s is not None:
            lines.append(f"  survivors training again after {self.recovery_s:.1f} s: "
                         f"world size {self.survivor_world}, resumed at step "
                         f"{self.resumed_step}")
        if self.rejoin_s is not None:
            lines.append(f"  node1 rejoined {self.rejoin_s:.1f} s after it was "
                         f"restarted: world size {self.rejoin_world} from step "
                         f"{self.rejoin_step}")
        if self.max_diff is not None:
            lines.append(f"  finished step {self.final_step}; final weights vs a run "
                         f"without failure: max |diff| = {self.max_diff:.1e}")
        if self.seconds is not None:
            lines.append(f"  whole run {self.seconds:.0f} s (first step after "
                         f"{self.first_step_s:.0f} s)")
        return "\n".join(lines)


def _wait(condition, deadline: float, poll: float = 0.05):
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(poll)
    return None


def node_failure(mode: str = "kill", rejoin: bool = True, resume: bool = True,
                 steps: int = 40,
                 step_s: float = 0.15, kill_at: int = 6, timeout: float = 10.0,
                 profile="1gbe", folder=None, deadline: float = 360.0) -> Failure:
    """Train on 2 nodes under ``torchrun --nnodes=1:2 --max-restarts=3``; fail node1.

    ``mode="kill"``: SIGKILL every process in node1's namespace (a node that dies);
    ``mode="link"``: take node1's link down (a cable pulled), then, once the
    survivors have seen the error, kill node1's processes (the node is fenced).
    The survivors' ranks fail in their next collective (at once for a kill: the
    connection closes; after ``timeout`` s for a silent link), their agent
    restarts them, they resume from the newest snapshot in a world of 1 node.
    With ``rejoin``, node1's link comes back and its torchrun is started again:
    the agents see a node waiting, restart into 2 nodes, and train on. The rank
    0 of the last world writes the final weights, compared with a run without
    failure (the global batch is fixed, so they agree to float rounding).
    ``resume=False`` stops everything once the survivor's error is seen (what a
    test of the error alone needs).
    """
    if mode not in ("kill", "link"):
        raise ValueError(_("mode is 'kill' or 'link', got {mode!r}.").format(mode=mode))
    folder = Path(folder or tempfile.mkdtemp(prefix="lab09_nodes_"))
    folder.mkdir(parents=True, exist_ok=True)
    command = torchrun_command(
        ["-m", "labkit.labs.fault_tolerance.node_faults", folder, steps, step_s], nnodes="1:2",
        rdzv_id="elastic", extra=["--max-restarts=3",
                                  RDZV_CONF])
    env = {**NO_SHARED_STORE, "LABKIT_NODE_TIMEOUT": str(timeout), "PYTHONUNBUFFERED":
           "1", "OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO",
           "LABKIT_HOLD_BELOW_WORLD": "2" if rejoin else "0"}
    began = time.time()
    end = time.monotonic() + deadline
    with cluster.Cluster(2, profile, verbose=False) as box:
        report = Failure(mode, box.describe())
        logs = {n: folder / f"{n}.log" for n in box.nodes}
        processes = {n: popen_logged(box, n, command, env, folder, logs[n])
                     for n in box.nodes}
        followers = {n: _Log(p) for n, p in logs.items()}
        try:
            _fail_and_recover(box, report, folder, processes, followers, end,
                              kill_at, timeout, mode, resume)
            if not resume:
                for node in box.nodes:
                    box.kill_node(node)
            elif rejoin and report.recovery_s is not None:
                _rejoin(box, report, folder, command, env, processes, followers, end)
            (folder / "release").write_text("")
            for node, process in processes.items():
                left = max(1.0, end - time.monotonic())
                try:
                    process.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    box.kill_node(node)
                    process.wait()
                report.returncodes[node] = process.returncode
        finally:
            for follower in followers.values():
                follower.close()
            report.logs = {n: f.text() for n, f in followers.items()}
    final = folder / "final.pt"
    progress = _records(folder, "progress")
    report.seconds = time.time() - began
    report.final_step = max((r["step"] for r in progress), default=None)
    report.first_step_s = min((r["time"] for r in progress), default=began) - began
    report.timeline = [(r["time"], r["node"], r["world_size"], r["step"])
                       for r in _records(folder, "start")]
    if final.exists():
        import torch

        got = torch.load(final, weights_only=True)
        want = reference_weights(steps)
        report.max_diff = max((got[k] - want[k]).abs().max().item() for k in want)
    return report


def _fail_and_recover(box, report, folder, processes, followers, end, kill_at,
                      timeout, mode, resume=True) -> None:
    def reached():
        rows = [r for r in _records(folder, "progress")
                if r["world_size"] == 2 and r["step"] >= kill_at]
        return rows[-1] if rows else None

    row = _wait(reached, end)
    if row is None:
        raise cluster.ClusterError(
            "the two nodes never reached step "
            f"{kill_at} together:\n" + "\n".join(
                f"--- {n}:\n{f.text()[-2500:]}" for n, f in followers.items()))
    latest = _latest(folder)
    report.snapshot_step = int(latest.stem.split("_")[1]) if latest else 0
    report.kill_step = row["step"]
    failed_at = time.time()
    if mode == "kill":
        box.kill_node("node1")
    else:
        box.link_down("node1")
    def error_seen():
        when, line = followers["node0"].first(PEER_ERRORS, failed_at)
        return (when, line) if when is not None else None

    seen = _wait(error_seen, end)
    if seen:
        report.error_s, report.error_line = seen[0] - failed_at, seen[1]
    if mode == "link":     # fence the cut-off node: nothing of it runs on
        box.kill_node("node1")
    if not resume:
        return

    def training_again():
        starts = [r for r in _records(folder, "start")
                  if r["time"] > failed_at and r["node"] == "node0"]
        if not starts:
            return None
        first = starts[0]
        later = [r for r in _records(folder, "progress")
                 if r["pid"] == first["pid"] and r["step"] > first["step"]]
        return (first, later[0]) if later else None

    found = _wait(training_again, end)
    if found:
        first, progress = found
        report.recovery_s = progress["time"] - failed_at
        report.resumed_step = first["step"]
        report.survivor_world = first["world_size"]
    processes["node1"].wait()


def _rejoin(box, report, folder, command, env, processes, followers, end) -> None:
    if report.mode == "link":
        box.link_up("node1")
    log = folder / "node1.rejoin.log"
    started = time.time()
    processes["node1"] = popen_logged(box, "node1", command, env, folder, log)
    followers["node1 (rejoined)"] = _Log(log)

    def both_training():
        starts = [r for r in _records(folder, "start")
                  if r["time"] > started and r["world_size"] == 2]
        if len({r["node"] for r in starts}) < 2:
            return None
        pids = {r["pid"]: r for r in starts}
        later = [r for r in _records(folder, "progress")
                 if r["pid"] in pids and r["step"] > pids[r["pid"]]["step"]]
        return (starts[0], later) if len({r["node"] for r in later}) == 2 else None

    found = _wait(both_training, end)
    if found:
        first, later = found
        report.rejoin_s = max(min(r["time"] for r in later if r["node"] == node)
                              for node in ("node0", "node1")) - started
        report.rejoin_world, report.rejoin_step = first["world_size"], first["step"]


if __name__ == "__main__":
    _elastic_main(sys.argv[1:])

