"""Checks for lab 03 (DistributedDataParallel): sharding like DistributedSampler, the
all-reduce the learner writes, the DDP worker with sampler and checkpoint, and the
same worker under torchrun.

The program checks launch the learner's module on 2 gloo ranks and compare with a
one-process reference trained on the same data in the same order. A rank-side
harness (``spied_train``) watches the calls that matter (``DistributedSampler``,
``set_epoch``, ``DDP``, ``torch.save``/``torch.load``, ``dist.barrier``) so that the
hint can name the classic mistake rather than only say "the weights differ".
"""

import functools
import importlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from labkit import crowding, data, models, privacy
from labkit.checks._core import ExerciseFailed, attempt, passed
from labkit.checks._reference import use_reference
from labkit.checks._solved import has_passed, prerequisite, solved
from labkit.checks._programs import (first_difference, launch_program, load_program,
                                     one_thread, run_command)
from labkit.messages import _

__all__ = ["use_reference", "solved", "has_passed",
           "shard_indices", "allreduce_worker", "ddp_worker", "ddp_under_torchrun",
           "one_process_sgd", "one_process_reference", "spied_train"]

TOLERANCE = 1e-5   # DDP vs one process, every parameter (float rounding is ~1e-7)


# ---------------------------------------------------------------- exercise 3.1


def _sampler_indices(num_samples, rank, world_size, epoch, seed, shuffle) -> list:
    sampler = DistributedSampler(range(num_samples), num_replicas=world_size,
                                 rank=rank, shuffle=shuffle, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def _shard_hint(got, num_samples, rank, world_size, epoch, seed) -> str:
    """Name the classic sharding mistake that produced ``got``."""
    per_rank = math.ceil(num_samples / world_size)
    if len(got) != per_rank:
        return _("Every rank must get ceil(N / world_size) = {per_rank} indices, "
                 "padding the list with its first indices so all ranks do the same "
                 "number of steps (uneven ranks hang DDP).").format(per_rank=per_rank)
    if epoch and got == _sampler_indices(num_samples, rank, world_size, 0, seed, True):
        return _("You shuffled the same way every epoch: seed the generator with "
                 "seed + epoch (that is what set_epoch is for).")
    return _("Shuffle all N indices with torch.randperm(N, generator=g) where "
             "g.manual_seed(seed + epoch), pad, then take every world_size-th index "
             "starting at rank: indices[rank::world_size].")


def shard_indices(fn) -> None:
    """Check ``fn(num_samples, rank, world_size, epoch, seed, shuffle)`` vs sampler."""
    name = "shard_indices"
    cases = [(10, 0, 2, 0, 0, False), (10, 1, 2, 0, 0, False), (10, 1, 3, 0, 0, False),
             (11, 0, 4, 0, 0, True), (11, 3, 4, 0, 0, True), (20, 1, 2, 3, 7, True)]
    for num_samples, rank, world_size, epoch, seed, shuffle in cases:
        got = attempt(name, fn, num_samples, rank, world_size, epoch, seed, shuffle)
        got = ([int(i) for i in got] if isinstance(got, (list, tuple, torch.Tensor))
               else got)
        want = _sampler_indices(num_samples, rank, world_size, epoch, seed, shuffle)
        if got != want:
            hint = (_shard_hint(got, num_samples, rank, world_size, epoch, seed)
                    if isinstance(got, list) else _("Return a list of ints."))
            raise ExerciseFailed(_(
                "{name}: N={num_samples}, rank {rank} of {world_size}, epoch {epoch}, "
                "seed {seed}, shuffle={shuffle}: DistributedSampler gives {want}, you "
                "gave {got}. {hint}").format(
                    name=name, num_samples=num_samples, rank=rank,
                    world_size=world_size, epoch=epoch, seed=seed, shuffle=shuffle,
                    want=want, got=got, hint=hint))
    passed(name, _("Index for index what DistributedSampler (with set_epoch) yields."))


# ---------------------------------------------------------------- exercise 3.2


@one_thread()
def one_process_sgd(steps: int, global_batch: int, lr: float, seed: int) -> dict:
    """Train small_cnn in this process on each whole global batch (the truth for
    exercise 3.2: what 2 ranks with half batches and averaged gradients must equal)."""
    torch.manual_seed(seed)
    model = models.small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    images, labels = data.random_batch(steps * global_batch, seed + 1)
    for step in range(steps):
        batch = slice(step * global_batch, (step + 1) * global_batch)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images[batch]), labels[batch]).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _check_shares(name: str, my_share, world_size: int, global_batch: int) -> None:
    """Call the learner's ``my_share`` for every rank: disjoint, complete, balanced."""
    ids = torch.arange(global_batch)
    shares = [attempt(name, my_share, ids.float().view(-1, 1), ids, r, world_size)
              for r in range(world_size)]
    taken = [s[1].tolist() for s in shares]
    flat = [i for share in taken for i in share]
    if len(flat) != len(set(flat)):
        raise ExerciseFailed(_(
            "{name}: my_share gives some samples to two ranks ({taken}): each rank "
            "must take its own slice, e.g. images[rank::world_size]. With the same "
            "data everywhere, N ranks do the work of one.").format(name=name,
                                                                   taken=taken))
    if sorted(flat) != ids.tolist():
        raise ExerciseFailed(_(
            "{name}: together the ranks see {seen} of {global_batch} samples: "
            "the slices must cover the whole global batch.").format(
                name=name, seen=len(flat), global_batch=global_batch))
    if len({len(share) for share in taken}) > 1:
        raise ExerciseFailed(_("{name}: the slices have sizes {sizes}: equal shares, or "
                               "the mean of means is not the mean.").format(
                                   name=name, sizes=[len(s) for s in taken]))
    if any(not torch.equal(x.view(-1).long(), y) for x, y in shares):
        raise ExerciseFailed(_("{name}: my_share must slice images and labels alike."
                               ).format(name=name))


def allreduce_worker(path="allreduce_worker.py", world_size: int = 2, steps: int = 8,
                     global_batch: int = 32, lr: float = 0.05) -> None:
    """Check the learner's all-reduce training equals one process on the whole batch.

    Launches ``train`` of the module at ``path`` on ``world_size`` gloo ranks.
    """
    name = "allreduce_worker"
    module = load_program(path)
    _check_shares(name, module.my_share, world_size, global_batch)
    ranks = launch_program(
        name, module.train, world_size, args=(steps, global_batch, lr, 0),
        hang_hint=_("Does every rank all-reduce every parameter, in the same order?"))
    for rank, weights in enumerate(ranks[1:], start=1):
        gap = first_difference(ranks[0], weights, 0.0)
        if gap:
            raise ExerciseFailed(_(
                "{name}: after {steps} steps rank {rank}'s {tensor} differs from rank "
                "0's by {gap:.2e}: the replicas drifted apart. Every rank must "
                "all_reduce every parameter's .grad (then divide), so that all of them "
                "take the same step.").format(name=name, steps=steps, rank=rank,
                                              tensor=gap[0], gap=gap[1]))
    want = one_process_sgd(steps, global_batch, lr, 0)
    gap = first_difference(want, ranks[0], TOLERANCE)
    if gap is None:
        passed(name, _("{world_size} ranks x {per_rank} images = one process x "
                       "{global_batch}, to {tolerance:g} after {steps} steps.").format(
                           world_size=world_size, per_rank=global_batch // world_size,
                           global_batch=global_batch, tolerance=TOLERANCE, steps=steps))
        return
    if first_difference(one_process_sgd(steps, global_batch, lr * world_size, 0),
                        ranks[0], TOLERANCE) is None:
        hint = _("That is the SUM of the gradients (as if the learning rate were "
                 "{world_size}x larger): all_reduce adds them up, so divide by "
                 "dist.get_world_size() to get the mean.").format(world_size=world_size)
    else:
        hint = _("Average each parameter's .grad over the ranks: "
                 "dist.all_reduce(p.grad) then p.grad /= world_size, after backward "
                 "and before step.")
    raise ExerciseFailed(_("{name}: after {steps} steps {tensor} differs from one "
                           "process on the whole batch by {gap:.2e} (tolerance "
                           "{tolerance:g}). {hint}").format(
                               name=name, steps=steps, tensor=gap[0], gap=gap[1],
                               tolerance=TOLERANCE, hint=hint))


# ---------------------------------------------------------------- exercise 3.3: reference


def one_process_reference(cfg, set_epoch: bool = True, world_size: int = 2) -> dict:
    """Train what DDP trains, in one process: each step one whole global batch.

    With N ranks, ``DistributedSampler`` deals rank r the indices order[r::N] of one
    shuffled order; step j of all ranks together is order[j*B:(j+1)*B] with
    B = batch_per_rank * N. The mean of the ranks' mean gradients is the mean over
    those B images, so one process stepping through the same order is the truth.
    ``set_epoch=False`` reproduces the classic mistake (same order every epoch).
    Computed once per setting in a kernel (a check's second attempt reuses it).
    """
    trained = _one_process_training(cfg.limit, cfg.batch_per_rank * world_size,
                                    cfg.seed, cfg.lr, cfg.epochs, set_epoch)
    return {name: t.clone() for name, t in trained.items()}


@functools.lru_cache(maxsize=8)
@one_thread()
def _one_process_training(limit: int, world_batch: int, seed: int, lr: float,
                          epochs: int, set_epoch: bool) -> dict:
    """What ``one_process_reference`` returns, for these settings (cached)."""
    split = data.DeviceData.mnist(train=True, limit=limit)
    torch.manual_seed(seed)
    model = models.small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for epoch in range(epochs):
        sampler = DistributedSampler(range(len(split)), num_replicas=1, rank=0,
                                     shuffle=True, seed=seed)
        if set_epoch:
            sampler.set_epoch(epoch)
        order = list(sampler)   # the same shuffle DistributedSampler deals out
        for start in range(0, len(order), world_batch):
            index = torch.tensor(order[start:start + world_batch])
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(split.images[index]), split.labels[index]).backward()
            optimizer.step()
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


# ---------------------------------------------------------------- exercise 3.3: harness


class _CheckStop(RuntimeError):
    """Raised inside a rank by a spy that caught a mistake before it could hang."""


SAVE_DELAY = 0.5   # s rank 0's save takes here: a rank that loads without waiting shows
_SPIED = ((torch, "save"), (torch.serialization, "save"), (torch, "load"),
          (torch.serialization, "load"), (dist, "barrier"),
          (dist.distributed_c10d, "barrier"))


def _file_name(f) -> str | None:
    """The path a torch.save/torch.load target names (a path, or an open file)."""
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else None


def _marker(path: str, stage: str) -> Path:
    """The file rank 0's save leaves when it starts ("saving") and ends ("written")."""
    return Path(f"{path}.labkit-{stage}")


@contextmanager
def _spies(ctx, events: list):
    """Record (in ``events``) the calls the DDP worker makes, in this rank.

    Every spelling is seen: ``torch.save``, ``from torch import save`` and
    ``torch.serialization.save`` alike, because the learner's module is imported
    while the spies are in place (``spied_train``). The spies only *explain*: the
    verdict comes from the weights the ranks return and the file they wrote. One
    piece of evidence is made here: a save takes ``SAVE_DELAY`` s between two
    markers, so a rank that reads the checkpoint before it is complete is caught (on
    a real disk it would read a half-written file).
    """
    def note(kind, **details):
        events.append({"kind": kind, "t": time.monotonic(), **details})

    originals = [getattr(owner, name) for owner, name in _SPIED]
    sampler_init, set_epoch = DistributedSampler.__init__, DistributedSampler.set_epoch
    ddp_init = DistributedDataParallel.__init__
    save, load, barrier = originals[0], originals[2], originals[4]

    def spied_sampler_init(self, *args, **kwargs):
        sampler_init(self, *args, **kwargs)
        note("sampler", num_replicas=self.num_replicas, rank=self.rank,
             shuffle=self.shuffle)

    def spied_set_epoch(self, epoch):
        note("set_epoch", epoch=epoch)
        set_epoch(self, epoch)

    def spied_ddp_init(self, module, *args, **kwargs):
        note("ddp")
        ddp_init(self, module, *args, **kwargs)

    def spied_save(obj, f, *args, **kwargs):
        note("save", keys=list(obj) if isinstance(obj, dict) else None)
        path = _file_name(f)
        if path:
            _marker(path, "saving").touch()
        time.sleep(SAVE_DELAY)   # a real file takes time to write
        save(obj, f, *args, **kwargs)
        if path:
            _marker(path, "written").touch()

    def spied_load(f, *args, **kwargs):
        given = kwargs.get("map_location", args[0] if args else None) is not None
        path = _file_name(f)
        note("load", map_location=given, path=path)
        if ctx.rank != 0 and path and (
                not os.path.exists(path) or (_marker(path, "saving").exists()
                                             and not _marker(path, "written").exists())):
            raise _CheckStop(_("labkit check: rank {rank} called torch.load before "
                               "rank 0 had finished writing the checkpoint").format(
                                   rank=ctx.rank))
        return load(f, *args, **kwargs)

    def spied_barrier(*args, **kwargs):
        note("barrier")
        return barrier(*args, **kwargs)

    spies = [spied_save, spied_save, spied_load, spied_load, spied_barrier,
             spied_barrier]
    DistributedSampler.__init__ = spied_sampler_init
    DistributedSampler.set_epoch = spied_set_epoch
    DistributedDataParallel.__init__ = spied_ddp_init
    for (owner, name), spy in zip(_SPIED, spies):
        setattr(owner, name, spy)
    try:
        yield
    finally:
        DistributedSampler.__init__, DistributedSampler.set_epoch = (sampler_init,
                                                                     set_epoch)
        DistributedDataParallel.__init__ = ddp_init
        for (owner, name), original in zip(_SPIED, originals):
            setattr(owner, name, original)


def spied_train(ctx, module_name: str, cfg_fields: dict) -> dict:
    """Rank worker: import and run the learner's ``train`` with the spies in place.

    Returns the weights the learner's ``train`` returned and what the spies saw.
    The module is imported inside the spies, so names it imported (``from torch
    import save``) are spied too; sending the result back pickles tensors (which
    calls torch.save), so the spies end before that.
    """
    events: list = []
    with _spies(ctx, events):
        sys.modules.pop(module_name, None)
        module = importlib.import_module(module_name)
        weights = module.train(ctx, module.Config(**cfg_fields))
    return {"weights": weights, "events": events}


# ---------------------------------------------------------------- exercise 3.3: check


def plain_keys(state: dict) -> dict:
    """Return ``state`` with DDP's ``module.`` prefix taken off every key.

    ``ddp_model.state_dict()`` (PyTorch's DDP tutorial saves that) names the weights
    ``module.0.weight``; ``ddp_model.module.state_dict()`` names them ``0.weight``.
    Both hold the same tensors.
    """
    return {(k[len("module."):] if isinstance(k, str) and k.startswith("module.")
             else k): v for k, v in state.items()}


def _weights_in(saved) -> dict | None:
    """Find the weights in a checkpoint: the state dict itself, or the one state dict
    inside a dict ({"model": ..., "epoch": ...}, as pytorch/examples saves)."""
    def is_state(obj):
        return (isinstance(obj, dict) and obj
                and all(isinstance(v, torch.Tensor) for v in obj.values()))

    if is_state(saved):
        return plain_keys(saved)
    if isinstance(saved, dict):
        inner = [v for v in saved.values() if is_state(v)]
        if inner:
            return plain_keys(inner[0])
    return None


def _read_checkpoint(path: str):
    """Load the file the ranks wrote (None if there is none; a dict may hold extras)."""
    if not os.path.exists(path):
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:   # e.g. a pickled Config next to the weights
        return torch.load(path, map_location="cpu", weights_only=False)


def _explain_crash(traceback_text: str) -> str | None:
    """Name the mistake behind an exception in the learner's DDP worker."""
    if ("_CheckStop" in traceback_text   # ours, in any language
            or "before rank 0 had finished writing" in traceback_text):
        return _("A rank loaded the checkpoint without waiting: call dist.barrier() on "
                 "every rank after rank 0's torch.save and before torch.load (without "
                 "it rank 1 reads a file that is not written yet).")
    if "FileNotFoundError" in traceback_text:
        return _("A rank loaded the checkpoint before rank 0 had written it: the "
                 "dist.barrier() must come after the save, on every rank.")
    if "has no attribute 'module'" in traceback_text:
        return _("model.module is DDP's wrapped model: wrap the model in "
                 "DistributedDataParallel (the `wrap` function), then save "
                 "model.module.state_dict().")
    return None


def _events(result: dict, kind: str) -> list:
    return [e for e in result["events"] if e["kind"] == kind]


def _explain_weights(ranks: list, epochs: int) -> str | None:
    """Name the missing or misplaced call behind wrong weights, from the spies."""
    for rank, result in enumerate(ranks):
        if not _events(result, "ddp"):
            return _("Rank {rank} never built DistributedDataParallel(...): `wrap` "
                     "must return DDP(model) (device_ids=[device] on a GPU); without it "
                     "the ranks never average their gradients.").format(rank=rank)
        samplers = _events(result, "sampler")
        if not samplers:
            return _("Rank {rank} made no DistributedSampler: without it every rank "
                     "reads the whole data set in the same order, so N ranks repeat one "
                     "rank's work. Pass sampler=DistributedSampler(dataset, ...) to the "
                     "DataLoader (and no shuffle=True there).").format(rank=rank)
        if samplers[-1]["num_replicas"] != len(ranks) or samplers[-1]["rank"] != rank:
            return _("Rank {rank}'s DistributedSampler has num_replicas="
                     "{num_replicas}, rank={sampler_rank}: each "
                     "rank then reads the wrong share (with num_replicas=1, the whole "
                     "data set). Leave both out: the sampler reads them from the "
                     "process group.").format(
                         rank=rank, num_replicas=samplers[-1]["num_replicas"],
                         sampler_rank=samplers[-1]["rank"])
        epochs_set = [e["epoch"] for e in _events(result, "set_epoch")]
        if epochs_set != list(range(epochs)):
            return _("Rank {rank} called sampler.set_epoch with {epochs_set}, expected "
                     "{expected}: call sampler.set_epoch(epoch) at the start "
                     "of every epoch, or every epoch repeats the first one's order."
                     ).format(rank=rank, epochs_set=epochs_set,
                              expected=list(range(epochs)))
    return None


def _check_checkpoint(name: str, ranks: list, path: str, want: dict) -> str:
    """Judge the file the ranks wrote and how they wrote and read it.

    Returns what could not be checked (for the pass line); raises on a mistake.
    """
    saved = _read_checkpoint(path)
    if saved is None:
        raise ExerciseFailed(_(
            "{name}: the ranks returned the right weights, but no checkpoint was "
            "written to cfg.checkpoint ({path}): rank 0 must torch.save the weights "
            "there, and every rank load them back from that file.").format(name=name,
                                                                           path=path))
    weights = _weights_in(saved)
    unseen = []
    if weights is None:
        unseen.append(_("what the checkpoint holds (no state dict found in it)"))
    else:
        gap = first_difference(want, weights, TOLERANCE)
        if gap:
            raise ExerciseFailed(_(
                "{name}: the checkpoint at cfg.checkpoint holds {tensor} off by "
                "{gap:.2e} from the trained weights: save the model's state_dict() "
                "after training.").format(name=name, tensor=gap[0], gap=gap[1]))
    savers = [r for r, result in enumerate(ranks) if _events(result, "save")]
    if savers and savers != [0]:
        raise ExerciseFailed(_(
            "{name}: rank(s) {savers} called torch.save: only rank 0 should write "
            "(all ranks hold the same weights; N writers race on one file).").format(
                name=name, savers=savers))
    if not savers:
        unseen.append(_("which rank wrote the file (it was not written with "
                        "torch.save)"))
    for rank, result in enumerate(ranks):
        loads = [e for e in _events(result, "load") if e["path"] in (None, path)]
        if not all(e["map_location"] for e in loads):
            raise ExerciseFailed(_(
                "{name}: rank {rank} called torch.load without map_location: on GPUs "
                "every rank would load onto the GPU the file was saved from (cuda:0). "
                "Pass map_location=ctx.device.").format(name=name, rank=rank))
    return "; ".join(unseen)


def ddp_worker(path="ddp_worker.py", epochs: int = 2, limit: int = 1024,
               batch_per_rank: int = 32) -> None:
    """Check the learner's DDP worker: 2 ranks equal one process; sampler, checkpoint.

    Launches ``train`` of the module at ``path`` on 2 gloo ranks (through
    ``spied_train``), compares the weights every rank loaded, and the file at
    ``cfg.checkpoint``, with ``one_process_reference`` (keys with or without DDP's
    ``module.`` prefix). The spies name the mistake behind wrong weights.
    """
    name = "ddp_worker"
    module = load_program(path)
    folder = tempfile.mkdtemp(prefix="labkit-ddp-check-")
    fields = {"epochs": epochs, "limit": limit, "batch_per_rank": batch_per_rank,
              "checkpoint": os.path.join(folder, "checkpoint.pt")}
    cfg = module.Config(**fields)
    try:
        ranks = launch_program(
            name, spied_train, 2, args=(module.__name__, fields), timeout=60,
            explain=_explain_crash, module=module.__name__,
            hang_hint=_("Is dist.barrier() called on every rank, not only on rank 0?"))
        want = one_process_reference(cfg)
        for rank, result in enumerate(ranks):
            got = result["weights"]
            gap = (first_difference(want, plain_keys(got), TOLERANCE)
                   if isinstance(got, dict) else (_("the weights"), float("inf")))
            if gap is None:
                continue
            hint = _explain_weights(ranks, epochs)
            if hint is None and isinstance(got, dict):
                same_order = one_process_reference(cfg, set_epoch=False)
                if first_difference(same_order, plain_keys(got), TOLERANCE) is None:
                    hint = _("That is the run without set_epoch: every epoch had the "
                             "same order.")
            hint = hint or _("Zero the gradients, then per batch: forward, "
                             "cross_entropy, backward, step; move each batch to "
                             "ctx.device.")
            raise ExerciseFailed(_(
                "{name}: rank {rank} loaded weights whose {tensor} differs from one "
                "process trained on the same {epochs} epochs by {gap:.2e} "
                "(tolerance {tolerance:g}). {hint}").format(
                    name=name, rank=rank, tensor=gap[0], epochs=epochs, gap=gap[1],
                    tolerance=TOLERANCE, hint=hint))
        unseen = _check_checkpoint(name, ranks, fields["checkpoint"], want)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    steps = epochs * limit // (2 * batch_per_rank)
    not_checked = ("; ".join(filter(None, [
        _("ranks on separate machines (one file system here: on a cluster the file "
          "must be on a disk every node sees)"),
        _("where loaded tensors land on GPUs (CPU ranks)"), unseen])))
    passed(name, _("2 ranks x {batch_per_rank} images = one process x "
                   "{global_batch}, to {tolerance:g} after {steps} steps; saved "
                   "once by rank 0, loaded everywhere after it was written. Not checked "
                   "here: {not_checked}.").format(
                       batch_per_rank=batch_per_rank, global_batch=2 * batch_per_rank,
                       tolerance=TOLERANCE, steps=steps, not_checked=not_checked))


# ---------------------------------------------------------------- exercise 3.4


def _torchrun_failure(stderr: str) -> str:
    """Say what went wrong in a torchrun run, from its stderr."""
    if "NotImplementedError" in stderr:
        return _("not done yet: setup_from_env still raises NotImplementedError.")
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line and not line.startswith(" ")]
    last = errors[-1] if errors else (lines[-1] if lines else _("(no output)"))
    hint = ""
    if "RANK" in last and "not set" in last:
        hint = _(" Read RANK, WORLD_SIZE and LOCAL_RANK from os.environ (torchrun sets "
                 "them).")
    elif "init_process_group" in stderr and "Default process group" in stderr:
        hint = _(" Call dist.init_process_group(backend, init_method='env://') first.")
    return _("torchrun failed: {error}.{hint}").format(error=last.strip(), hint=hint)


_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "GROUP_RANK", "ROLE_RANK")


@contextmanager
def _fake_node(module, gpus: int, local_rank: int, world_size: int, seen: dict):
    """Pretend to be torchrun's rank ``local_rank`` of ``world_size`` on a node with
    ``gpus`` GPUs: torchrun's variables, a fake torch.cuda count, and an
    init_process_group that only records its backend (``seen``)."""
    def init_process_group(backend=None, *args, **kwargs):
        seen["backend"], seen["device_id"] = backend, kwargs.get("device_id")

    fakes = {(torch.cuda, "device_count"): lambda: gpus,
             (torch.cuda, "is_available"): lambda: gpus > 0,
             (torch.cuda, "set_device"): lambda device: seen.setdefault("set", device),
             (dist, "init_process_group"): init_process_group,
             (dist.distributed_c10d, "init_process_group"): init_process_group,
             (dist, "is_initialized"): lambda: "backend" in seen,
             (dist, "get_rank"): lambda group=None: local_rank,
             (dist, "get_world_size"): lambda group=None: world_size,
             (dist, "get_backend"): lambda group=None: seen.get("backend")}
    originals = {key: getattr(*key) for key in fakes}
    by_object = {id(original): fakes[key] for key, original in originals.items()}
    imported = {name: value for name, value in vars(module).items()
                if id(value) in by_object}   # from torch.distributed import ...
    saved_env = {name: os.environ.get(name) for name in _TORCHRUN_ENV}
    os.environ.update(RANK=str(local_rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", GROUP_RANK="0",
                      ROLE_RANK=str(local_rank))
    for (owner, name), fake in fakes.items():
        setattr(owner, name, fake)
    for name, value in imported.items():
        setattr(module, name, by_object[id(value)])
    try:
        yield
    finally:
        for (owner, name), original in originals.items():
            setattr(owner, name, original)
        for name, value in imported.items():
            setattr(module, name, value)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _device_choices(name: str, module) -> str:
    """Run the learner's ``setup_from_env`` as 2 processes on nodes with 0, 1 and 2
    GPUs (faked): the backend must be one per job, NCCL with one GPU per process.

    This is how the GPU branch is checked on a machine without GPUs. Raises on a
    choice that cannot work; returns what it could not check ("" when all ran).
    """
    for gpus in (0, 1, 2):
        chosen = []
        for local_rank in (0, 1):
            seen: dict = {}
            try:
                with _fake_node(module, gpus, local_rank, 2, seen):
                    ctx = module.setup_from_env()
            except NotImplementedError:
                raise ExerciseFailed(_("{name}: not done yet: setup_from_env still "
                                       "raises NotImplementedError.").format(name=name)
                                     ) from None
            except Exception as err:   # it needs something the fake does not have
                return _("the device choice on GPUs (setup_from_env stopped against a "
                         "fake torch.cuda: {error_type}: {error})").format(
                             error_type=type(err).__name__, error=err)
            backend = seen.get("backend") or getattr(ctx, "backend", None)
            device = torch.device(getattr(ctx, "device", "cpu"))
            chosen.append((str(backend).lower(), device, seen))
        backends = {backend for backend, _device, _seen in chosen}
        if len(backends) > 1:
            detail = ", ".join(_("local rank {rank} {backend} on {device}").format(
                                   rank=r, backend=b, device=d)
                               for r, (b, d, _seen) in enumerate(chosen))
            raise ExerciseFailed(_(
                "{name}: on a node with {gpus} GPU(s) and 2 processes your "
                "setup_from_env chose {detail}: one job must use ONE backend (the "
                "ranks would wait for each other forever). Choose per job, not per "
                "process: NCCL only when torch.cuda.device_count() >= "
                "int(os.environ['LOCAL_WORLD_SIZE']), else gloo on the CPU everywhere."
            ).format(name=name, gpus=gpus, detail=detail))
        if "nccl" in backends:
            devices = [d for _backend, d, _seen in chosen]
            if (gpus < 2 or any(d.type != "cuda" for d in devices)
                    or len(set(devices)) < 2):
                raise ExerciseFailed(_(
                    "{name}: on a node with {gpus} GPU(s) and 2 processes your "
                    "setup_from_env chose NCCL on {devices}: NCCL "
                    "needs a GPU of its own for every process, cuda:<LOCAL_RANK>. With "
                    "fewer GPUs than LOCAL_WORLD_SIZE, use gloo on the CPU.").format(
                        name=name, gpus=gpus, devices=[str(d) for d in devices]))
    return ""


def ddp_under_torchrun(path="ddp_script.py", worker_path="ddp_worker.py",
                       epochs: int = 1, limit: int = 512, timeout: float = 180) -> None:
    """Check the script runs the same worker under ``torchrun --standalone``, 2 ranks.

    First ``setup_from_env`` runs against faked nodes with 0, 1 and 2 GPUs (the
    backend must be one per job). Then ``torchrun --standalone --nproc-per-node=2
    <path> <out> <epochs> <limit>`` runs (torchrun's agent, its workers forked with
    torch imported: ``labkit.torchrun_preloaded``) with the GPUs hidden, so the ranks are gloo
    CPU processes whose float32 arithmetic matches the CPU reference to 1e-5 (on
    GPUs TF32 convolutions differ by ~1e-4); the script saves what rank 0 loaded to
    ``out``, compared with the reference.
    """
    name = "ddp_under_torchrun"
    prerequisite(worker_path)   # 3.3's worker, which the script imports: passed
    script = Path(path).resolve()
    unseen = _device_choices(name, load_program(script))
    crowding.wait_for_memory(3)   # torchrun's agent and 2 workers, each importing torch
    timeout = crowding.patience(timeout)
    folder = Path(tempfile.mkdtemp(prefix="labkit-torchrun-check-"))
    out = folder / "weights.pt"
    # torchrun's stores listen on every interface: in a network namespace of their
    # own where the machine allows it, else with a line saying so (privacy.loopback_only)
    torchrun, _fenced = privacy.loopback_only(
        [sys.executable, "-m", "labkit.torchrun_preloaded", "--standalone",
         "--local-addr=127.0.0.1",   # meet at loopback, not at the host name's address
         "--nproc-per-node=2", str(script), str(out), str(epochs), str(limit)])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(script.parent), *sys.path]),
           **privacy.job_environment(str(folder))}   # torchelastic_* logs go there too
    try:
        done = run_command(torchrun, timeout, busy_extra=2 * timeout, env=env,
                           cwd=script.parent)
    except subprocess.TimeoutExpired:
        shutil.rmtree(folder, ignore_errors=True)
        raise ExerciseFailed(_("{name}: torchrun did not finish within {timeout:g} s: "
                               "a rank waits for another (init_process_group on every "
                               "rank? the same world size? one backend for the job?)."
                               ).format(name=name, timeout=timeout)
                             + crowding.overload_note()) from None
    if done.returncode != 0 or not out.exists():
        shutil.rmtree(folder, ignore_errors=True)
        raise ExerciseFailed(_("{name}: {failure}").format(
            name=name, failure=_torchrun_failure(done.stderr)))
    saved = torch.load(out, weights_only=True)
    shutil.rmtree(folder)
    weights = _weights_in(saved) or {}
    module = load_program(worker_path)
    want = one_process_reference(module.Config(epochs=epochs, limit=limit))
    gap = first_difference(want, weights, TOLERANCE)
    if gap:
        raise ExerciseFailed(_(
            "{name}: under torchrun, {tensor} differs from one process by "
            "{gap:.2e}: is every rank in one process group of world size 2 "
            "(read WORLD_SIZE and RANK, not LOCAL_RANK alone)?").format(
                name=name, tensor=gap[0], gap=gap[1]))
    gpu = (_("not checked: {unseen}").format(unseen=unseen) if unseen else
           _("the GPU choice was checked against a faked node with 0, 1 and 2 GPUs"))
    passed(name, _("The same worker, unchanged, under torchrun: same weights as one "
                   "process (CPU ranks, GPUs hidden for exact float32; {gpu}).").format(
                       gpu=gpu))
