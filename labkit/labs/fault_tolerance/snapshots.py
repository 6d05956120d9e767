"""The model, data and training step that lab 09's snapshots must reproduce bit for bit.

Taught in: lab 09 (fault tolerance). The learner writes the snapshot functions and the
elastic loop; this module holds what both share with the checks: a small MLP with
dropout (so the RNG state matters), seeded data, one training step, the course's loop
(``train``), which the uninterrupted reference run and the check's interrupted and
resumed runs all go through, and ``kill_during_save``, which SIGKILLs a process in
the middle of a save to see what is left on disk.
"""

import io
import multiprocessing
import os
import signal
import time
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from labkit import _spawn, data

__all__ = ["Config", "build", "dataset", "steps_per_epoch", "train_step",
           "sampler_batches", "train", "reference", "kill_during_save",
           "save_in_place"]


@dataclass(frozen=True)
class Config:
    """One training run: sizes, cadence and seeds (every rank builds the same one)."""

    steps: int = 24             # optimizer steps in the whole run
    every: int = 4              # a snapshot after every `every` steps
    batch_per_rank: int = 16    # the global batch is batch_per_rank x world_size
    samples: int = 256          # images in the (random, seeded) data set
    lr: float = 0.01            # Adam
    seed: int = 0
    hidden: int = 64
    dropout: float = 0.25       # dropout draws from each rank's RNG every step


def build(cfg: Config):
    """Return (DDP model, Adam optimizer), then seed this rank's own RNG stream.

    Same initial weights on every rank (seeded before the model is built); after
    that, rank r's dropout masks come from seed + 1 + r, so the RNG state differs
    per rank and a snapshot must hold every rank's.
    """
    torch.manual_seed(cfg.seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, cfg.hidden), nn.ReLU(),
                          nn.Dropout(cfg.dropout), nn.Linear(cfg.hidden, 10))
    model = DDP(model)   # CPU ranks (gloo): the lab's bit-for-bit claims are on CPU
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    torch.manual_seed(cfg.seed + 1 + dist.get_rank())
    return model, optimizer


def dataset(cfg: Config):
    """Return the images (samples, 1, 28, 28) and labels: the same on every rank."""
    return data.random_batch(cfg.samples, cfg.seed + 1)


def steps_per_epoch(cfg: Config, world_size: int) -> int:
    """Return full batches per epoch on each rank (DistributedSampler, drop_last)."""
    return cfg.samples // world_size // cfg.batch_per_rank


def train_step(model, optimizer, images, labels) -> float:
    """One optimizer step (DDP averages the gradients in backward); return the loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


def sampler_batches(cfg: Config, rank: int, world_size: int, start_step: int):
    """Yield this rank's index batches from ``start_step`` on: the course's own answer.

    Epoch e is DistributedSampler's order after set_epoch(e); step s is batch
    s % steps_per_epoch of epoch s // steps_per_epoch.
    """
    per_epoch = steps_per_epoch(cfg, world_size)
    epoch, skip = divmod(start_step, per_epoch)
    while True:
        sampler = DistributedSampler(range(cfg.samples), num_replicas=world_size,
                                     rank=rank, shuffle=True, seed=cfg.seed,
                                     drop_last=True)
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for i in range(skip, per_epoch):
            yield order[i * cfg.batch_per_rank:(i + 1) * cfg.batch_per_rank]
        epoch, skip = epoch + 1, 0


def _rng_fingerprint() -> int:
    """Return a checksum of this process's torch RNG state (it changes every draw)."""
    return zlib.crc32(torch.get_rng_state().numpy().tobytes())


def train(ctx, cfg: Config, batches=sampler_batches, load=None, save=None,
          stop_at: int | None = None) -> dict:
    """The lab's loop, on every rank: resume, train to ``cfg.steps``, snapshot.

    ``load()`` (if given) restores model and optimizer and returns the step to resume
    at; ``save(model, optimizer, step)`` runs after every ``cfg.every`` steps.
    ``stop_at`` ends the run early, as a crash right after that snapshot would.
    Returns the weights; per step, the first sample, the RNG checksum before the
    step and the loss; and the RNG checksums right after ``build`` and right after
    ``load`` (the checks compare these between runs: a state changed between the
    restore and the first step was drawn from by something else).
    """
    model, optimizer = build(cfg)
    images, labels = dataset(cfg)
    built = _rng_fingerprint()
    step = load(model.module, optimizer) if load else 0
    start, log, restored = step, [], _rng_fingerprint()
    for index in batches(cfg, ctx.rank, ctx.world_size, step):
        if step in (cfg.steps, stop_at):
            break
        rng = _rng_fingerprint()
        loss = train_step(model, optimizer, images[index], labels[index])
        log.append({"step": step, "first": int(index[0]), "rng": rng, "loss": loss})
        step += 1
        if save and step % cfg.every == 0:
            save(model.module, optimizer, step)
    weights = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    return {"weights": weights, "log": log, "start": start,
            "rng_built": built, "rng_restored": restored}


def reference(ctx, cfg: Config) -> dict:
    """Rank worker: the uninterrupted run, no snapshot (what resumes must equal)."""
    return train(ctx, cfg)


# ---------------------------------------------------------------- a kill mid-save

STALL_S = 60.0   # how long the stalled writer waits for its SIGKILL


def _stalling_save(obj, f, *args, **kwargs) -> None:
    """Stand-in for torch.save: write half the bytes, say so, and wait to be killed."""
    buffer = io.BytesIO()
    _REAL_SAVE(obj, buffer, *args, **kwargs)
    payload = buffer.getvalue()
    half = len(payload) // 2
    target = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "?")
    if isinstance(target, int):   # os.fdopen(mkstemp()[0]): the file's name is its fd
        target = _name_of_fd(target)
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as out:
            out.write(payload[:half])
            device = os.fstat(out.fileno()).st_dev
    else:
        f.write(payload[:half])
        f.flush()
        device = _device_of(f)
    marker = os.environ["LABKIT_STALL_MARKER"]
    with open(f"{marker}.tmp", "w") as out:   # the parent never reads half a marker
        out.write(f"{os.fspath(target)}\n{half}\n{len(payload)}\n{device}\n")
    os.replace(f"{marker}.tmp", marker)
    time.sleep(STALL_S)


_REAL_SAVE = torch.save


def _device_of(f) -> int:
    """Return the device of the file object ``f`` is, or -1 (an io.BytesIO has none)."""
    try:
        return os.fstat(f.fileno()).st_dev
    except (AttributeError, OSError):   # io.UnsupportedOperation is an OSError
        return -1


def _name_of_fd(fd: int) -> str:
    """Return the path an open file descriptor names (Linux's /proc), else '?'."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def _save_then_stall(module: str, qualname: str, obj, path: str, marker: str) -> None:
    """Child process: call ``module.qualname(obj, path)``; torch.save stalls in it."""
    os.environ["LABKIT_STALL_MARKER"] = marker
    torch.save = _stalling_save   # before the import: `from torch import save` too
    _spawn.import_worker(module, qualname)(obj, path)


def _context():
    """A fast, CUDA-safe way to start the child: the preloaded forkserver if any."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods
                                       else "spawn")


def kill_during_save(save_fn, folder, timeout: float = 120.0) -> dict:
    """SIGKILL a process half-way through ``save_fn(new, path)``; report what is left.

    ``folder/snapshot.pt`` first holds a complete previous snapshot. A child process
    then calls ``save_fn`` (a module-level function) with a torch.save that writes
    half of the bytes and stalls; the parent kills it there. Returns the bytes
    written/total, the file torch.save was writing (``writing``: its name;
    ``writing_path`` and ``writing_device``: where it was, -1 if unknown), whether
    ``snapshot.pt`` still loads and still holds the previous snapshot, the files
    left in ``folder``, and whether the child ended by itself before any torch.save
    (``finished``; False when ``timeout`` ran out first, e.g. on a machine too
    loaded to import torch).
    """
    path, marker = os.path.join(folder, "snapshot.pt"), os.path.join(folder, "stalled")
    previous = {"step": 4, "weights": torch.arange(4096.0)}
    torch.save(previous, path)
    child = _context().Process(
        target=_save_then_stall, daemon=True,
        args=(save_fn.__module__, save_fn.__qualname__,
              {"step": 8, "weights": torch.arange(4096.0) + 1}, path, marker))
    child.start()
    deadline = time.monotonic() + timeout
    while not os.path.exists(marker) and child.is_alive():
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    stalled = os.path.exists(marker)
    finished = not stalled and not child.is_alive()   # it ended without torch.save
    if child.is_alive():
        os.kill(child.pid, signal.SIGKILL)   # the power cut, in the middle of the write
    child.join()
    return dict(_inspect(path, marker, stalled, previous, child.exitcode),
                finished=finished)


def _inspect(path: str, marker: str, stalled: bool, previous: dict, code) -> dict:
    """Say what a killed save left: does the snapshot load, and is it the old one?"""
    report = {"stalled": stalled, "exitcode": code, "writing": None, "written": 0,
              "total": 0, "loads": False, "previous_intact": False, "error": "",
              "writing_path": None, "writing_device": -1}
    if stalled:
        with open(marker) as f:
            writing, written, total, device = f.read().split("\n")[:4]
        os.remove(marker)
        report.update(writing=os.path.basename(writing), written=int(written),
                      total=int(total), writing_path=writing,
                      writing_device=int(device))
    try:
        found = torch.load(path, weights_only=True)
        report["loads"] = True
        report["previous_intact"] = (found.get("step") == previous["step"] and
                                     torch.equal(found["weights"], previous["weights"]))
    except Exception as err:   # a torn file raises RuntimeError, or anything else
        report["error"] = f"{type(err).__name__}: {err}".strip()
    report["left"] = sorted(os.listdir(os.path.dirname(path)))
    return report


def save_in_place(obj, path) -> None:
    """The naive save (for comparison): torch.save straight onto the snapshot's path."""
    torch.save(obj, path)
