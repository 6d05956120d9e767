"""Checks for lab 02 (data parallelism in one process, then nn.DataParallel): the
learner's ``parallel_apply``, the data-parallel step by hand, the ``module.`` prefix.

Lab 02 has no ranks: ``nn.DataParallel`` is threads in one process, and so are the
learner's programs. The program checks import the ``%%writefile`` module afresh
(``load_program``) and run it here, in a watchdog thread (``_watch.call``: nothing
hangs), the replicas in the learner's threads. ``parallel_apply`` gets probe replicas
that finish out of order (they wait on each other's events, not on a clock: no
verdict depends on this machine's speed) and one that raises. The data-parallel step
runs for several steps on an uneven batch (127 images over 2 and over 3 replicas,
split as ``tensor_split`` or as ``chunk`` does) against the one-model step. The
verdict is what the step computed (the gradient at ``optimizer.step()``, the weights,
the loss); spies (``_watch.spies``) that see every forward and optimizer step only
explain a wrong result, naming the classic mistake.
"""

import copy
import re
import threading
import time
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from labkit import data, models
from labkit.labs.data_parallel import dataparallel
from labkit.checks._core import ExerciseFailed, attempt, passed
from labkit.checks._reference import use_reference
from labkit.checks._solved import has_passed, prerequisite, solved
from labkit.checks._programs import load_program
from labkit.checks._watch import call, spies
from labkit.messages import N_, _

__all__ = ["use_reference", "solved", "has_passed",
           "parallel_apply", "data_parallel_step", "strip_module_prefix",
           "GRAD_TOLERANCE", "TOLERANCE"]

GRAD_TOLERANCE = 1e-6   # |gradient handed to optimizer.step() - one model's|
TOLERANCE = 1e-5        # |weights after the steps - one model's| (rounding: ~1e-8)


def _require(name, module, path, *functions) -> None:
    """Fail clearly when the learner's module lacks a function the check calls."""
    missing = [f for f in functions if not callable(getattr(module, f, None))]
    if missing:
        raise ExerciseFailed(_("{exercise}: {path} has no function {functions}: keep "
                               "the names the cell gives, and run it again.").format(
                                   exercise=name, path=path,
                                   functions=", ".join(missing)))


# ---------------------------------------------------------------- exercise 2.1

WAIT = 5.0    # s a probe waits for the replicas it waits on: far above any thread
              # start-up, so only a solution that runs replicas one by one pays it
LINGER = 1.0  # s a probe sleeps after that (the GIL is free): what a join must wait for
# What the failing probe raises (ValueError); the check looks for it in what the
# learner's parallel_apply raised.
_PROBE_ERROR = N_("probe {index} failed on purpose")


class _Log(dict):
    """Replica i -> (start, end, thread, grad mode); plus an event per replica."""

    def __init__(self, count):
        super().__init__()
        self.ended = [threading.Event() for _unused in range(count)]


def _probe(i, waits_on, linger, log, fail, x):
    """A replica for the check: wait for others to end, sleep, note when, maybe raise.

    Waiting on events (not on a clock) makes the finishing order certain whenever
    the replicas really run at the same time: replica 0 waits for all the others.
    """
    start = time.monotonic()
    try:
        for j in waits_on:
            log.ended[j].wait(WAIT)
        time.sleep(linger)
        if fail:
            raise ValueError(_(_PROBE_ERROR).format(index=i))
        return (i, x)
    finally:
        log[i] = (start, time.monotonic(), threading.get_ident(),
                  torch.is_grad_enabled())
        log.ended[i].set()


def _probes(waits, lingers, fail=None):
    """Return (fns, args, log): replica i waits for waits[i], then returns (i, 100+i)."""
    log = _Log(len(waits))
    fns = [partial(_probe, i, w, s, log, i == fail)
           for i, (w, s) in enumerate(zip(waits, lingers))]
    return fns, [(100 + i,) for i in range(len(waits))], log


def _wait_for(log, count, timeout=2 * WAIT) -> None:
    """Wait until ``count`` probes have logged (a learner's threads may outlive it)."""
    deadline = time.monotonic() + timeout
    while len(log) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def _order_hint(got, log) -> str:
    finished = [i for i, _unused in sorted(log.items(), key=lambda kv: kv[1][1])]
    firsts = [g[0] for g in got if isinstance(g, tuple) and g] if isinstance(
        got, (list, tuple)) else None
    if firsts == finished:
        return _("You returned the results in the order the threads finished "
                 "({finished}): result i must be replica i's, whichever finishes "
                 "first. Store each result in slot i (results[i] = ...).").format(
                     finished=finished)
    return _("Result i must be fns[i](*args[i]), in the order of fns.")


def _check_results(name, done, log, count) -> None:
    want = [(i, 100 + i) for i in range(count)]
    missing = sorted(set(range(count)) - set(log))
    if missing:
        _wait_for(log, count)
        raise ExerciseFailed(_(
            "{exercise}: parallel_apply returned before replica(s) {replicas} "
            "finished: join() every thread before reading the results.").format(
                exercise=name, replicas=missing))
    got = done.value
    if not isinstance(got, (list, tuple)) or list(got) != want:
        raise ExerciseFailed(_("{exercise}: with replica 0 finishing last, expected "
                               "{want}, got {got!r}. {hint}").format(
                                   exercise=name, want=want, got=got,
                                   hint=_order_hint(got, log)))
    spans = sorted((start, end) for start, end, _thread, _grad in log.values())
    if all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])):
        where = (_("all in the calling thread") if all(
            entry[2] == done.thread for entry in log.values()) else _(
            "in threads, but each started after the previous one ended: start, join, "
            "start, join"))
        raise ExerciseFailed(_(
            "{exercise}: the replicas ran one after the other, {where}. Replica 0 "
            "waits for the others to end, so it waited in vain: start every thread "
            "first, then join them all.").format(exercise=name, where=where))


def _messages(error, depth=0) -> list:
    """The texts an exception carries: message, notes, causes, grouped exceptions."""
    if error is None or depth > 6:
        return []
    texts = [str(error), *map(str, getattr(error, "__notes__", ()))]
    context = None if error.__suppress_context__ else error.__context__
    for inner in (error.__cause__, context, *getattr(error, "exceptions", ())):
        texts += _messages(inner, depth + 1)
    return texts


# "replica 1", "Replica #1", "fns[1]", and the Chinese edition's words: "副本 1", "第 1 个副本"
_NAMES_REPLICA_1 = re.compile(r"(replica|fns|副本)\W{0,3}(#|no\.?|number|index|i\s*=)?"
                              r"\s*\[?\s*1\b|第\s*1\s*个?\s*副本", re.IGNORECASE)


def _check_exception(name, module, filename, timeout) -> None:
    """Replica 1 raises at once while the others sleep: raised, named, waited for?"""
    fns, args, log = _probes([(), (), ()], [0.0, 0.0, LINGER], fail=1)
    lost, hook = [], threading.excepthook
    threading.excepthook = lambda hook_args: lost.append(hook_args.exc_value)
    try:
        raised = call(name, filename, module.parallel_apply, fns, args,
                      timeout=timeout, errors=True).error
    finally:
        finished = set(log)
        _wait_for(log, len(fns))   # stragglers end before the hook is restored
        threading.excepthook = hook
    if raised is None:
        died = (_(" The thread died with ValueError, printed by threading.excepthook, "
                  "and nobody noticed.") if lost else "")
        raise ExerciseFailed(_(
            "{exercise}: replica 1 raised {probe_error!r}, but parallel_apply returned "
            "normally: the exception was swallowed.{died} Catch it in the thread "
            "(try/except), keep it, and raise it in the caller after the joins.").format(
                exercise=name, probe_error=ValueError(_(_PROBE_ERROR).format(index=1)),
                died=died))
    text = "\n".join(_messages(raised))
    if not _NAMES_REPLICA_1.search(text):
        raise ExerciseFailed(_(
            "{exercise}: you raised {error_type}: {error}, which does not say which "
            "replica failed. Name it: raise RuntimeError(f'replica {{i}} raised ...') "
            "from err.").format(exercise=name, error_type=type(raised).__name__,
                                error=raised))
    if _(_PROBE_ERROR).format(index=1) not in text:
        raise ExerciseFailed(_(
            "{exercise}: you raised {error_type}: {error}, but the replica's own error "
            "is lost. Keep it: `raise ... from err`, or put its text in the "
            "message.").format(exercise=name, error_type=type(raised).__name__,
                               error=raised))
    running = sorted(set(range(len(fns))) - finished)
    if running:
        raise ExerciseFailed(_(
            "{exercise}: you raised before replica(s) {replicas} finished: join every "
            "thread first, so that nothing is left running.").format(
                exercise=name, replicas=running))


def _check_grad_mode(name, module, filename, timeout) -> None:
    fns, args, log = _probes([(), ()], [0.0, 0.0])
    call(name, filename, module.parallel_apply, fns, args, grad=False,
         timeout=timeout)
    if any(entry[3] for entry in log.values()):
        raise ExerciseFailed(_(
            "{exercise}: called under torch.no_grad(), the replicas ran with gradients "
            "ON. Grad mode is per thread and a new thread starts with it on: read "
            "torch.is_grad_enabled() in the caller and wrap each call in "
            "`with torch.set_grad_enabled(grad_enabled):` (PyTorch's parallel_apply "
            "does).").format(exercise=name))


def parallel_apply(path="parallel_apply.py", timeout: float = 30.0) -> None:
    """Check the learner's ``parallel_apply(fns, args)`` from the module at ``path``.

    Probe replicas finish in the order 1, 2, 0: replica 0 waits until the others
    have ended, replica 2 until replica 1 has (events, not a clock: nothing here
    depends on this machine's speed). Then replica 1 raises while replica 2 still
    sleeps; then the call runs under ``torch.no_grad()``. A call that takes more
    than ``timeout`` s fails (it waits for a dead replica).
    """
    name = "parallel_apply"
    module = load_program(path)
    _require(name, module, path, "parallel_apply")
    fns, args, log = _probes([(1, 2), (), (1,)], [LINGER, 0.0, 0.0])
    done = call(name, path, module.parallel_apply, fns, args, timeout=timeout)
    _check_results(name, done, log, len(fns))
    _check_exception(name, module, path, timeout)
    _check_grad_mode(name, module, path, timeout)
    passed(name, _("results in replica order although replica 0 finished last; "
                   "replicas 1 and 2 ran while replica 0 was still running; replica "
                   "1's exception raised in the caller, naming it, after every thread "
                   "had ended; grad mode carried over."))


# ---------------------------------------------------------------- exercise 2.2: parts


def _placement(name, module, filename) -> str:
    """Check that replica i and chunk i land on devices[i], with meta as device 1+.

    On a machine without enough GPUs every replica is on the CPU, so ``.to(device)``
    mistakes are invisible there; the meta device (shapes, no data) makes them show.
    Returns what could not be checked ("" when all of it could).
    """
    devices = [torch.device("cpu")] + [torch.device("meta")] * 2
    model = models.small_cnn()
    images, labels = data.random_batch(9, seed=5)
    try:
        copies = module.replicate(model, devices)
        chunks = module.scatter(images, labels, devices)
        placed = ([{p.device for p in c.parameters()} for c in copies],
                  [{x.device, y.device} for x, y in chunks])
    except Exception as err:   # the learner's code may not take meta: skip, say so
        return _("where replicas and chunks land (your code raised {error_type} on a "
                 "meta device)").format(error_type=type(err).__name__)
    for kind, sets in zip(("replica", "chunk"), placed):
        for i, (found, device) in enumerate(zip(sets, devices)):
            if found != {device}:
                raise ExerciseFailed(_(_MISPLACED[kind]).format(
                    exercise=name, devices=[str(d) for d in devices], index=i,
                    found=sorted(str(d) for d in found), device=device))
    return ""


_MISPLACED = {   # a replica or a chunk i not on devices[i]: _(...).format(...)
    "replica": N_("{exercise}: with devices {devices}, replica {index} is on {found}, "
                  "not on {device}: move replica i to devices[i] (`.to(device)`). On "
                  "GPUs this puts every replica on one GPU, or crashes."),
    "chunk": N_("{exercise}: with devices {devices}, chunk {index} is on {found}, not "
                "on {device}: move chunk i to devices[i] (`.to(device)`). On GPUs this "
                "puts every replica on one GPU, or crashes."),
}


def _check_replicate(name, module, filename, devices) -> None:
    model = models.small_cnn().to(devices[0])
    copies = call(name, filename, module.replicate, model, devices).value
    if (not isinstance(copies, (list, tuple)) or len(copies) != len(devices)
            or not all(isinstance(c, nn.Module) for c in copies)):
        raise ExerciseFailed(_("{exercise}: replicate must return a list of one copy "
                               "per device ({count}), got {copies!r:.80}.").format(
                                   exercise=name, count=len(devices), copies=copies))
    for i, (replica, device) in enumerate(zip(copies, devices)):
        if replica is model:
            raise ExerciseFailed(_(
                "{exercise}: replicate's replica {index} is the model itself: every "
                "replica must be a copy (copy.deepcopy(model).to(device)), or the "
                "threads write their gradients into one model and the weighting is "
                "lost.").format(exercise=name, index=i))
        pairs = list(zip(model.parameters(), replica.parameters()))
        if any(p.data_ptr() == q.data_ptr() for p, q in pairs):
            raise ExerciseFailed(_(
                "{exercise}: replicate's replica {index} shares its parameters with the "
                "model (a shallow copy): use copy.deepcopy, so each replica has "
                "weights and a .grad of its own.").format(exercise=name, index=i))
        if any(q.device != device or not torch.equal(p.to(device), q)
               for p, q in pairs):
            raise ExerciseFailed(_("{exercise}: replicate's replica {index} must hold "
                                   "the model's weights, on {device}.").format(
                                       exercise=name, index=i, device=device))


def _split_sizes(total: int, parts: int) -> dict:
    """The two splits real code uses: tensor_split's and chunk's (nn.DataParallel's)."""
    batch = torch.arange(total)
    return {"tensor_split": [len(c) for c in batch.tensor_split(parts)],
            "chunk": [len(c) for c in batch.chunk(parts)]}


def _check_scatter(name, module, filename, devices) -> None:
    labels = torch.arange(10)
    images = labels.float().view(10, 1).expand(10, 3).clone()
    chunks = call(name, filename, module.scatter, images, labels, devices).value
    if not isinstance(chunks, (list, tuple)) or any(len(c) != 2 for c in chunks):
        raise ExerciseFailed(_("{exercise}: scatter must return a list of (images, "
                               "labels) pairs, got {chunks!r:.80}.").format(
                                   exercise=name, chunks=chunks))
    sizes = [len(y) for _images, y in chunks]
    splits = _split_sizes(10, len(devices))
    if sizes not in splits.values():
        raise ExerciseFailed(_(
            "{exercise}: scatter of 10 samples over {count} devices should give sizes "
            "{tensor_split_sizes} (tensor_split: as equal as possible) or {chunk_sizes} "
            "(chunk, as nn.DataParallel splits), got {sizes}. Try "
            "images.tensor_split(len(devices)).").format(
                exercise=name, count=len(devices),
                tensor_split_sizes=splits["tensor_split"], chunk_sizes=splits["chunk"],
                sizes=sizes))
    if any(not torch.equal(x[:, 0].long().cpu(), y.cpu()) for x, y in chunks):
        raise ExerciseFailed(_("{exercise}: scatter's images and labels do not match "
                               "chunk by chunk: split both the same way.").format(
                                   exercise=name))
    if torch.cat([y.cpu() for _images, y in chunks]).tolist() != list(range(10)):
        raise ExerciseFailed(_("{exercise}: scatter's chunks, put back together, must "
                               "be the batch in its original order.").format(
                                   exercise=name))
    if any(x.device != d or y.device != d for (x, y), d in zip(chunks, devices)):
        raise ExerciseFailed(_("{exercise}: scatter must move chunk i to "
                               "devices[i].").format(exercise=name))


def _check_forward_backward(name, module, filename) -> None:
    torch.manual_seed(0)
    replica = models.small_cnn()
    reference = copy.deepcopy(replica)
    images, labels = data.random_batch(5, seed=3)
    loss = call(name, filename, module.forward_backward, replica, images, labels).value
    want = F.cross_entropy(reference(images), labels)
    want.backward()
    grads = [p.grad for p in replica.parameters()]
    if any(g is None for g in grads):
        raise ExerciseFailed(_("{exercise}: after forward_backward the replica has no "
                               ".grad: call loss.backward() on the replica's "
                               "loss.").format(exercise=name))
    truth = [p.grad for p in reference.parameters()]
    if _close(grads, [len(labels) * g for g in truth]):
        raise ExerciseFailed(_("{exercise}: forward_backward computed the gradient of "
                               "the SUMMED loss: use the mean over the chunk "
                               "(F.cross_entropy's default), the weighting comes "
                               "later.").format(exercise=name))
    if not _close(grads, truth):
        raise ExerciseFailed(_("{exercise}: forward_backward's gradients are not those "
                               "of F.cross_entropy(replica(images), labels).").format(
                                   exercise=name))
    if not _is_close(loss, want.item()):
        raise ExerciseFailed(_("{exercise}: forward_backward returned {loss!r}, "
                               "expected the chunk's mean loss {want:.6f}.").format(
                                   exercise=name, loss=loss, want=want.item()))


def _check_reduce(name, module, filename) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    images, labels = torch.randn(7, 3), torch.tensor([0, 1, 1, 0, 1, 0, 0])
    sizes, replicas = [5, 2], [copy.deepcopy(model) for _unused in range(2)]
    for replica, x, y in zip(replicas, images.split(sizes), labels.split(sizes)):
        F.cross_entropy(replica(x), y).backward()   # each: its chunk's mean loss
    truth = torch.autograd.grad(F.cross_entropy(model(images), labels),
                                list(model.parameters()))
    call(name, filename, module.reduce_gradients, model, replicas, sizes)
    got = [p.grad for p in model.parameters()]
    if any(g is None for g in got):
        raise ExerciseFailed(_("{exercise}: reduce_gradients left the model's .grad "
                               "empty: the average must land in each model "
                               "parameter's .grad.").format(exercise=name))
    if _close(got, truth):
        return
    per_replica = [[p.grad for p in r.parameters()] for r in replicas]
    hint = _average_hint(got, per_replica, sizes)
    raise ExerciseFailed(_("{exercise}: with chunks of {sizes}, reduce_gradients gave "
                           "another gradient than the whole batch's. {hint}").format(
                               exercise=name, sizes=sizes, hint=hint))


def _average_hint(got, per_replica, sizes) -> str:
    """Name the wrong average that produced ``got`` from the replicas' gradients."""
    def combine(weights):
        return [sum(w * g[i] for w, g in zip(weights, per_replica))
                for i in range(len(per_replica[0]))]

    if _close(got, combine([1 / len(sizes)] * len(sizes))):
        return _("That is the plain mean of the replicas: with chunks of {sizes} a "
                 "sample in a small chunk counts more than one in a big chunk. Weight "
                 "replica r by n_r / N.").format(sizes=sizes)
    if _close(got, combine([1] * len(sizes))):
        return _("That is the sum of the replicas' gradients: weight replica r by "
                 "n_r / N (the weights add up to 1).")
    if _close(got, combine(sizes)):
        return _("That is weighted by n_r but not divided by N = sum(sizes).")
    return _("The model's gradient is sum over replicas of n_r / N * replica_r's .grad.")


def _close(got, want) -> bool:
    return len(got) == len(want) and all(
        g is not None and g.shape == w.shape and torch.allclose(
            g.detach().cpu().double(), w.detach().cpu().double(),
            rtol=1e-5, atol=GRAD_TOLERANCE) for g, w in zip(got, want))


def _is_close(value, want: float) -> bool:
    try:
        return abs(float(value) - want) <= 1e-5 * max(1.0, abs(want))
    except (TypeError, ValueError, RuntimeError):
        return False


# ---------------------------------------------------------------- exercise 2.2: step


def _structure_hint(seen, num_replicas, batch) -> str:
    """Explain a wrong result from what the spies saw ("" when nothing stands out)."""
    if seen.foreign_steps and not seen.steps:
        return _("An optimizer over other parameters than the model's (a replica's?) "
                 "took a step. The replicas are thrown away after each step: step the "
                 "optimizer passed in, over model.parameters(): the one true model.")
    if len(seen.steps) > 1:
        return _("The model's optimizer stepped {steps} times: exactly one "
                 "optimizer.step() per batch, after the gradients are averaged.").format(
                     steps=len(seen.steps))
    if seen.steps and not seen.steps[0]["given"]:
        return _("You stepped a new optimizer: use the one passed in (its state, "
                 "here SGD's momentum, must live across steps).")
    forwards = seen.forwards
    if any(f["model"] for f in forwards):
        return _("The model itself ran forward: run the replicas on their chunks; the "
                 "model only receives the averaged gradient and steps.")
    sizes = sorted((f["size"] for f in forwards), reverse=True)
    if len(forwards) != num_replicas or sum(sizes) != batch:
        return _("The replicas ran forward on chunks of {sizes}: expected {count} "
                 "chunks, {batch} images in all (one chunk per device).").format(
                     sizes=sizes, count=num_replicas, batch=batch)
    stale = max((f["gap"] for f in forwards), default=0.0)
    if stale > 0:
        return _("A replica's weights differed from the model's by {gap:.1e} when "
                 "it ran: the replicas were made once and reused. Only the model is "
                 "updated by optimizer.step(), so from the second step on old replicas "
                 "are stale. Replicate the model at every step (nn.DataParallel does "
                 "it in every forward).").format(gap=stale)
    return ""


def _true_step(model, images, labels):
    """Return the one model's loss and gradients on a batch, at its current weights."""
    reference = copy.deepcopy(model)
    loss = F.cross_entropy(reference(images), labels)
    return loss.item(), list(torch.autograd.grad(loss, list(reference.parameters())))


def _gradient_hint(before, images, labels, sizes, grads, previous, want) -> str:
    """Name the wrong average behind a wrong gradient at ``optimizer.step()``."""
    if previous is not None and _close(grads, [w + p for w, p in zip(want, previous)]):
        return _("That is this batch's gradient PLUS the previous step's: the "
                 "gradients accumulated. Call optimizer.zero_grad() at every step, "
                 "before reduce_gradients adds the new ones to .grad.")
    if not sizes or sum(sizes) != len(labels):
        return ""
    chunks = zip(images.split(sizes), labels.split(sizes))
    per_replica = [_true_step(before, x, y)[1] for x, y in chunks]
    return _average_hint(grads, per_replica, sizes)


def _loss_hint(loss, before, images, labels, sizes) -> str:
    if sizes and sum(sizes) == len(labels):
        losses = [_true_step(before, x, y)[0]
                  for x, y in zip(images.split(sizes), labels.split(sizes))]
        if _is_close(loss, sum(losses) / len(losses)):
            return _("That is the plain mean of the replicas' losses: with chunks of "
                     "{sizes}, weight replica r's loss by n_r / N too.").format(
                         sizes=sizes)
    return _("Return the mean loss over the whole batch, a float: the sum of "
             "n_r / N * loss_r.")


@dataclass
class _Reference:
    """The one-model twin that the learner's step is compared with, step by step."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    previous: list | None = None   # the gradient of the last step (zero_grad hint)


def _check_one_step(name, filename, step_fn, model, optimizer, batch, devices, where,
                    twin: _Reference) -> list:
    """Run the learner's step once under the spies, judge what it computed; return
    the batch sizes the replicas ran on. Spies only explain a wrong result."""
    images, labels = batch
    before = copy.deepcopy(model)
    loss_want, want = _true_step(before, images, labels)
    with spies(model, optimizer) as seen:
        done = call(name, filename, step_fn, model, optimizer, images, labels, devices)
    twin.optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(twin.model(images), labels).backward()
    twin.optimizer.step()
    sizes = sorted((f["size"] for f in seen.forwards), reverse=True)
    explain = _structure_hint(seen, len(devices), len(labels))
    grads = seen.steps[0]["grads"] if seen.steps else None
    if grads is None:
        raise ExerciseFailed(_(
            "{exercise}: {where}, optimizer.step() never ran over the model's "
            "parameters. {hint}").format(
                exercise=name, where=where,
                hint=explain or _("Step the optimizer passed in, once.")))
    if any(g is None for g in grads):
        raise ExerciseFailed(_(
            "{exercise}: {where}, the model had no .grad when optimizer.step() ran: "
            "the gradients stay on the replicas until reduce_gradients puts their "
            "weighted average into the model's .grad.").format(exercise=name,
                                                               where=where))
    if not _close(grads, want):
        gap = max((g.cpu().double() - w.cpu().double()).abs().max().item()
                  for g, w in zip(grads, want))
        hint = explain or _gradient_hint(before, images, labels, sizes, grads,
                                         twin.previous, want)
        raise ExerciseFailed(_(
            "{exercise}: {where}, the gradient handed to optimizer.step() differs from "
            "the one model's on the whole batch by {gap:.1e} (tolerance "
            "{tolerance:g}). {hint}").format(exercise=name, where=where, gap=gap,
                                             tolerance=GRAD_TOLERANCE,
                                             hint=hint).rstrip())
    gap = models.max_difference(dict(twin.model.named_parameters()),
                                dict(model.named_parameters()))
    if gap > TOLERANCE:
        raise ExerciseFailed(_(
            "{exercise}: {where}, the gradient was right but the weights after the step "
            "differ from the one model's by {gap:.1e} (tolerance {tolerance:g}). "
            "{hint}").format(
                exercise=name, where=where, gap=gap, tolerance=TOLERANCE,
                hint=explain or _("Does the step change anything besides .grad and "
                                  "step?")))
    if not _is_close(done.value, loss_want):
        raise ExerciseFailed(_(
            "{exercise}: {where}, data_parallel_step returned {loss!r}, the one "
            "model's loss is {want:.6f}. {hint}").format(
                exercise=name, where=where, loss=done.value, want=loss_want,
                hint=_loss_hint(done.value, before, images, labels, sizes)))
    if seen.forwards and all(f["thread"] == done.thread for f in seen.forwards):
        raise ExerciseFailed(_(
            "{exercise}: {where}, the result is right, but the replicas ran one after "
            "the other in the calling thread: the exercise asks for them in threads. "
            "Run forward_backward on every replica with your parallel_apply, one "
            "thread each, as nn.DataParallel does.").format(exercise=name, where=where))
    twin.previous = want
    return sizes


def _train(name, filename, step_fn, num_replicas, steps, batch, lr) -> tuple:
    """Run ``steps`` learner steps against the one-model step; return (weight gap,
    the chunk sizes the replicas ran on)."""
    devices = dataparallel.replica_devices(num_replicas, verbose=False)
    torch.manual_seed(0)
    model = models.deep_mlp(num_layers=3, width=32).to(devices[0])   # quick to run
    reference = copy.deepcopy(model)
    # Momentum: an optimizer made afresh at every step would forget it (caught).
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    twin = _Reference(reference, torch.optim.SGD(reference.parameters(), lr=lr,
                                                 momentum=0.9))
    images, labels = data.random_batch(steps * batch, num_replicas, devices[0])
    for step in range(steps):
        x, y = images[step * batch:][:batch], labels[step * batch:][:batch]
        where = _("at step {step} ({batch} images over {count} replicas)").format(
            step=step + 1, batch=batch, count=num_replicas)
        sizes = _check_one_step(name, filename, step_fn, model, optimizer, (x, y),
                                devices, where, twin)
    gap = models.max_difference(dict(reference.named_parameters()),
                                dict(model.named_parameters()))
    return gap, sizes


def data_parallel_step(path="dp_step.py", helper="parallel_apply.py", steps: int = 3,
                       batch: int = 127, lr: float = 0.1) -> None:
    """Check the learner's data-parallel step (module at ``path``) against one model.

    First its pieces (replicate, scatter, forward_backward, reduce_gradients) on small
    cases, then ``steps`` SGD steps (momentum 0.9) of ``batch`` images over 2 and over
    3 replicas: the gradient at ``optimizer.step()``, the weights after it and the
    loss must equal the one model's. ``helper`` is the learner's parallel_apply
    module, imported afresh first.
    """
    name = "data_parallel_step"
    prerequisite(helper)   # 2.1's, passed (fresh: the step imports the latest one)
    module = load_program(path)
    _require(name, module, path, "replicate", "scatter", "forward_backward",
             "reduce_gradients", "data_parallel_step")
    with dataparallel.exact_float32():
        devices = dataparallel.replica_devices(3, verbose=False)
        _check_replicate(name, module, path, devices)
        _check_scatter(name, module, path, devices)
        unchecked = [_placement(name, module, path)]
        _check_forward_backward(name, module, path)
        _check_reduce(name, module, path)
        runs = {n: _train(name, path, module.data_parallel_step, n, steps, batch, lr)
                for n in (2, 3)}
    gap = max(g for g, _sizes in runs.values())
    split = {n: "+".join(map(str, sizes)) for n, (_gap, sizes) in runs.items()}
    if devices[0].type == "cpu":
        unchecked.append(_("that reduce_gradients brings each replica's gradient to "
                           "the model's device (all replicas share the CPU here)"))
    placed = ("" if unchecked[0] else _("; replica i and chunk i land on devices[i] "
                                        "(checked with the meta device as devices 1 "
                                        "and 2)"))
    note = "; ".join(u for u in unchecked if u)
    passed(name, _("{batch} images over 2 replicas ({split_2}) and 3 ({split_3}) on "
                   "{device}, in threads, {steps} SGD steps each of a small MLP: the "
                   "gradient at optimizer.step() equals the one model's to "
                   "{grad_tolerance:g}, the weights to {gap:.0e} (tolerance "
                   "{tolerance:g}){placed}.").format(
                       batch=batch, split_2=split[2], split_3=split[3],
                       device=devices[0].type, steps=steps,
                       grad_tolerance=GRAD_TOLERANCE, gap=gap, tolerance=TOLERANCE,
                       placed=placed)
                 + (_(" Not checked here: {note}.").format(note=note) if note else ""))


# ---------------------------------------------------------------- exercise 2.3


def strip_module_prefix(fn) -> None:
    """Check ``fn(state_dict)`` drops the leading ``module.`` and nothing else."""
    name = "strip_module_prefix"
    model = nn.Sequential(nn.Linear(2, 2))
    model.add_module("module", nn.Linear(2, 1))  # a layer really called "module"
    wrapped = nn.DataParallel(model)
    got = attempt(name, fn, wrapped.state_dict())
    want = model.state_dict()
    if not isinstance(got, dict) or list(got) != list(want):
        hint = _(
            "Remove only a LEADING 'module.': key[len('module.'):] when "
            "key.startswith('module.'). str.replace also hits a layer named "
            "'module' inside the model."
        )
        raise ExerciseFailed(_("{exercise}: expected keys {want}, got {got!r}. "
                               "{hint}").format(
                                   exercise=name, want=list(want),
                                   got=list(got) if isinstance(got, dict) else got,
                                   hint=hint))
    fresh = nn.Sequential(nn.Linear(2, 2))
    fresh.add_module("module", nn.Linear(2, 1))
    fresh.load_state_dict(got)
    if any(not torch.equal(got[k], want[k]) for k in want):
        raise ExerciseFailed(_(
            "{exercise}: keep every tensor as it is; only rename the keys."
        ).format(exercise=name))
    passed(name, _("The checkpoint now loads into the plain model (strict=True)."))
