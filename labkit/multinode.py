"""Multi-node for real on one machine: the course's multi-node commands, a real shaped
link and a node that fails, on ``labkit.cluster``'s network-namespace nodes.

Taught in: lab 03 (``ddp_two_nodes``: the two-node ``torchrun`` command, one per
node), lab 06 (``compression_on_link``: PowerSGD on a real shaped link next to the
``sleep`` emulation; ``labkit bench allreduce --link``) and lab 09
(``node_failure``: a node killed or cut off mid-training, the survivors resuming
from their snapshot under ``torchrun --nnodes=1:2 --max-restarts``, and the node
rejoining). Everything here needs root: ``labkit.cluster.unavailable()`` says why
not, and the labs print that reason and skip.

``python -m labkit.multinode FOLDER STEPS STEP_S`` (what ``node_failure`` starts
under torchrun on each node) is an elastic training script that survives a change
of world size: it keeps the global batch (32 images, split over the ranks), saves
``{model, optimizer, step}`` from rank 0 every 4 steps, and draws each step's batch
from the step number alone, so 2 ranks, 1 rank, and 2 again train what one process
trains (up to float rounding: the gradient is a mean of means).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit import cluster
from labkit.messages import _

__all__ = ["torchrun", "torchrun_command", "run_together", "ddp_two_nodes",
           "compression_on_link", "ElasticConfig", "node_failure", "reference_weights"]

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


def _popen_logged(box, node, argv, env, cwd, log_path):
    with open(log_path, "w") as log:
        return box.popen(node, argv, env=env, cwd=cwd, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)


def run_together(box, commands: dict, env: dict | None = None, cwd=None,
                 timeout: float = 240.0) -> dict:
    """Start each node's command at once (``{node: argv}``); wait for all of them.

    ``env``: added to every node's environment, or ``{node: {...}}`` per node.
    Returns ``{node: NodeRun}``; on timeout every process in the cluster is killed
    and the runs that had not ended have ``returncode`` None.
    """
    per_node = env if env and set(env) <= set(box.nodes) else {
        n: (env or {}) for n in commands}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="labkit-nodes-") as logs:
        processes = {node: _popen_logged(box, node, argv,
                                         {"OMP_NUM_THREADS": "1",
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


# ---------------------------------------------------------------- lab 03

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


# ---------------------------------------------------------------- lab 06

def compression_on_link(profile="1gbe", specs=("allreduce", "powersgd-1"),
                        steps: int = 40, width: int = 512, limit: int = 4096,
                        cfg=None, emulated=None, verbose: bool = True) -> dict:
    """Time DDP hooks on the ``sleep`` emulation and, as root, on a real shaped link.

    Both train the lab's MLP (784-width-width-10) with each hook on 2 gloo ranks for
    ``steps`` steps (PowerSGD's warm-up: the first quarter), or with ``cfg`` (a
    ``compression.CompressionConfig``). Emulation: the ranks run here, and
    ``ByteCounter`` sleeps each all-reduce's bytes x 2(N-1)/N at the link's rate
    (``compression.train_variants``'s slow-link steps); ``emulated`` passes results
    of that run already made (lab 06, section 3), matched by hook name. Real: one
    rank in each of two namespace nodes, the link shaped by tbf, no sleep. Returns
    ``{"rows", "reason", "link", "emulated", "real"}``: per hook the bytes per step,
    the ms per step here, emulated and real (None without root), and its bytes'
    time on the wire; ``reason`` says why there is no real run.
    """
    from labkit import compression, launch

    chosen = cluster.link(profile)
    if chosen.rate_bits is None:
        raise ValueError(_("compression_on_link needs a link with a rate (1gbe, ...)."))
    if cfg is None:
        cfg = compression.CompressionConfig(
            steps=steps, width=width, limit=limit, test_limit=1000,
            powersgd_start=max(2, steps // 4), slow_steps=max(3, steps // 4),
            slow_link_gbytes_per_s=chosen.bytes_per_s / 1e9)
    if emulated is None:
        emulated = launch.run(compression.train_variants, 2,
                              args=(cfg, list(specs)), timeout=300)[0]
    names = [compression.label(spec) for spec in specs]
    by_name = {r["name"]: r for r in emulated}
    emulated = [by_name[name] for name in names]
    reason = cluster.unavailable()
    real = None
    if reason is None:
        with cluster.Cluster(2, chosen, verbose=False) as box:
            real = box.launch(compression.train_variants, args=(cfg, list(specs)),
                              timeout=300)[0]
    rows = []
    for i, spec in enumerate(specs):
        row = {"hook": emulated[i]["name"], "bytes_per_step":
               emulated[i]["bytes_per_step"], "local_ms": emulated[i]["ms_per_step"],
               "emulated_ms": emulated[i]["slow_link_ms"],
               "real_ms": real[i]["ms_per_step"] if real else None,
               "wire_ms": 1e3 * emulated[i]["bytes_per_step"] / chosen.bytes_per_s}
        rows.append(row)
    if verbose:
        print(_("MLP 784-{width}-{width}-10, 2 ranks, {steps} steps per hook; emulated "
                "link {gbytes_per_s:g} GB/s; real link {link}").format(
                    width=cfg.width, steps=cfg.steps,
                    gbytes_per_s=cfg.slow_link_gbytes_per_s, link=chosen.describe()))
        # the column names are the rows' fields (kept English, as in the returned dict)
        print(f"{'hook':<12}{'bytes/step':>12}{'on the wire':>13}{'local':>9}"
              f"{'emulated':>10}{'real link':>11}   " + _("(ms per step)"))
        for r in rows:
            real_ms = f"{r['real_ms']:>11.1f}" if r["real_ms"] is not None else \
                f"{'-':>11}"
            print(f"{r['hook']:<12}{r['bytes_per_step']:>12,}{r['wire_ms']:>13.1f}"
                  f"{r['local_ms']:>9.1f}{r['emulated_ms']:>10.1f}{real_ms}")
        if reason:
            print(_("real shaped link: {reason}; skipped, the emulation alone above.")
                  .format(reason=reason))
    return {"rows": rows, "reason": reason, "link": chosen.describe(),
            "emulated": emulated, "real": real}


# ---------------------------------------------------------------- lab 09

@dataclass(frozen=True)
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
    """The script torchrun runs on every node (``python -m labkit.multinode``)."""
    import socket

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit import data, elastic, launch

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
        ["-m", "labkit.multinode", folder, steps, step_s], nnodes="1:2",
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
        processes = {n: _popen_logged(box, n, command, env, folder, logs[n])
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
    processes["node1"] = _popen_logged(box, "node1", command, env, folder, log)
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
