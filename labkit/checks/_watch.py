"""Watch the learner's code run in this process: a watchdog thread, so that a check
never hangs, and spies on what a training step does (forwards, optimizer steps).

Taught in: nowhere (what lab 02's program checks share; lab 02 has no ranks, so
``_programs.launch_program`` does not apply). ``call`` runs the learner's function
in a thread of its own with a timeout; ``spies`` records, while a step runs, every
forward of a whole copy of the model and every optimizer step, so that a check can
name a mistake (stale replicas, a replica's optimizer) instead of only a difference.
"""

import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from labkit.checks._core import ExerciseFailed
from labkit.checks._programs import IN_YOUR_CODE, _learner_lines
from labkit.messages import _

__all__ = ["Call", "Seen", "call", "spies"]


@dataclass
class Call:
    """What a watched call gave: its value or its exception, and where it ran."""

    value: object = None
    error: BaseException | None = None
    traceback: str = ""
    thread: int = 0   # threading.get_ident() of the thread that called the function


def _not_done(error: BaseException) -> bool:
    chain = [error, error.__cause__, error.__context__]
    return any(isinstance(e, NotImplementedError) for e in chain)


def call(name: str, filename: str, fn, *args, grad: bool = True,
         timeout: float = 60.0, errors: bool = False) -> Call:
    """Call the learner's ``fn(*args)`` in a watchdog thread and return a ``Call``.

    The thread runs with grad mode ``grad`` (grad mode is per thread). A call still
    running after ``timeout`` s fails the check (the thread is left behind as a
    daemon). A stub's NotImplementedError is "not done yet"; any other exception
    fails with the learner's own lines, unless ``errors`` asks for it back.
    """
    done = Call()

    def target():
        done.thread = threading.get_ident()
        try:
            with torch.set_grad_enabled(grad):
                done.value = fn(*args)
        except BaseException as err:   # reported to the caller, never lost
            done.error, done.traceback = err, traceback.format_exc()

    watched = threading.Thread(target=target, name=f"labkit-check-{name}", daemon=True)
    watched.start()
    watched.join(timeout)
    if watched.is_alive():
        raise ExerciseFailed(_(
            "{exercise}: {function} did not return within {timeout:g} s. Is it "
            "waiting for a thread that never ends, or for a result that a failed "
            "replica never delivers (a queue.get() per replica)?").format(
                exercise=name, function=fn.__name__, timeout=timeout))
    if done.error is None or errors:
        return done
    if _not_done(done.error):
        raise ExerciseFailed(_("{exercise}: not done yet. Replace `raise "
                               "NotImplementedError()` in {filename} with your code, "
                               "run its cell, then this one.").format(
                                   exercise=name, filename=filename))
    where = _learner_lines(done.traceback, filename)
    raise ExerciseFailed(_("{exercise}: {function} raised {error_type}: {error}").format(
                             exercise=name, function=fn.__name__,
                             error_type=type(done.error).__name__, error=done.error)
                         + (_(IN_YOUR_CODE).format(where=where) if where else ""))


@dataclass
class Seen:
    """What the spies saw during one step."""

    forwards: list = field(default_factory=list)   # whole copies of the model
    steps: list = field(default_factory=list)      # steps of an optimizer of the model
    foreign_steps: int = 0                         # steps over other parameters


@contextmanager
def spies(model, optimizer):
    """Record, while the block runs, forwards of whole copies of ``model`` and steps.

    A forward is recorded for any module whose parameters have the shapes of
    ``model``'s (the model or a copy of it): its batch size, its thread, and how far
    its weights are from the model's at that moment (0 for a fresh copy). A step of an
    optimizer over ``model``'s parameters records the model's ``.grad`` then and
    whether it was ``optimizer``; a step over other parameters is counted.
    """
    seen = Seen()
    own = list(model.parameters())
    shapes, ids = [p.shape for p in own], {id(p) for p in own}

    def on_forward(module, args):
        params = list(module.parameters())
        if [p.shape for p in params] != shapes:
            return   # a layer inside a copy: only whole copies count
        with torch.no_grad():
            gap = max((p.to(q.device) - q).abs().max().item()
                      for p, q in zip(params, own))
        size = len(args[0]) if args and torch.is_tensor(args[0]) else 0
        seen.forwards.append({"model": module is model, "size": size, "gap": gap,
                              "thread": threading.get_ident()})

    def on_step(opt, args, kwargs):
        if {id(p) for group in opt.param_groups for p in group["params"]} != ids:
            seen.foreign_steps += 1
            return
        seen.steps.append({"given": opt is optimizer, "grads": [
            None if p.grad is None else p.grad.detach().clone() for p in own]})

    handles = [register_module_forward_pre_hook(on_forward),
               register_optimizer_step_pre_hook(on_step)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
