"""The rank workers that run the learner's capstone modules, and what they send back.

Taught in: lab 10 (the checks and the measurements launch these with
``launch.run``). Each one imports the learner's module inside the recorders (so that
``from torch.distributed import isend`` binds the recorded version too), runs it, and
returns what the rank computed: losses, the weights after each step (named as in the
whole GPT), the collectives and messages it sent. ``Options`` says how much to record.
"""

import importlib
import logging
import time
import traceback
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from labkit import p2p, timeline, train
from labkit.labs.capstone import gpt, layout
from labkit.labs.capstone.recorder import Recorder
from labkit.checks._programs import torch_refused
from labkit.messages import _

__all__ = ["Options", "local_weights", "recorders", "mesh_groups",
           "optimizer_state_bytes", "run_trainer", "call_learner"]

_KNOWN = None


@dataclass(frozen=True)
class Options:
    """What a rank records: ``snapshots`` (weights after every step), ``lazy`` (hold
    asynchronous all-reduces back until waited for), ``bound_s`` (stop a message that
    waits longer, naming it; gloo only), ``p2p`` (count messages without bounding),
    ``warmup`` (steps run before the clock starts, for timings), ``memory`` (the
    bytes this rank holds: parameters, gradients, optimizer states, activations),
    ``lr`` (a learning rate per step, set on ``trainer.optimizer``: a schedule),
    ``sharded`` (a module whose ``ShardedOptimizer`` replaces the Trainer's: ZeRO-1
    with clipping by the global norm, exercise 10.7; the norms its
    ``global_grad_norm`` returns are recorded)."""

    snapshots: bool = True
    lazy: bool = True
    bound_s: float | None = 15.0
    p2p: bool = False
    warmup: int = 0
    memory: bool = False
    lr: tuple | None = None
    sharded: str | None = None   # the learner's zero1_clip module: its optimizer


def _known_names(cfg) -> list:
    global _KNOWN
    if _KNOWN is None or _KNOWN[0] != cfg.model:
        names = [name for name, _p in gpt.GPT(cfg.model).named_parameters()]
        _KNOWN = (cfg.model, names)
    return _KNOWN[1]


def local_weights(module, cfg) -> dict:
    """This rank's parameters, named as in the whole GPT, on the CPU (a DTensor: its
    local shard)."""
    named = {}
    for name, param in module.named_parameters():
        value = param.to_local() if hasattr(param, "to_local") else param
        named[name] = value.detach().cpu().clone()
    return layout.canonical(named, _known_names(cfg))


def _stub_file(err: BaseException, module_name: str) -> str | None:
    """The learner's file, other than ``module_name``'s, whose stub raised ``err``."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return None
    path = Path(frames[-1].filename)
    ours = Path(__file__).resolve().parents[2], Path(torch.__file__).resolve().parent
    if path.stem == module_name or any(folder in path.resolve().parents
                                       for folder in ours):
        return None
    return path.name


def call_learner(fn, module_name: str, *args, **kwargs):
    """Call the learner's ``fn``; torch's own NotImplementedError (an operation it does
    not support) becomes a RuntimeError naming the learner's line, so that it is not
    mistaken for the exercise's stub (a bare NotImplementedError); the stub of
    another exercise's file (a module this one imports) is named, with its way past."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as err:
        if not str(err):
            other = _stub_file(err, module_name)
            if other:
                raise RuntimeError(_(
                    "{file} is not done yet (its stub raised NotImplementedError): "
                    "solve its exercise first, or take its reference with "
                    "`checks.use_reference(\"{file}\")`.").format(file=other)) from None
            raise
        raise torch_refused(err, module_name) from None


def recorders(ctx, options: Options, stack: ExitStack):
    """Enter the recorders ``options`` asks for; return (recorder, guard, messages)."""
    messages: list = []
    guard = None
    if options.bound_s and ctx.backend == "gloo":
        guard = stack.enter_context(p2p.bounded(ctx.rank, options.bound_s, messages))
    recorder = Recorder(lazy=options.lazy, p2p=guard is None and options.p2p,
                        messages=messages, uncoalesced=guard is not None, guard=guard)
    stack.enter_context(recorder.active())
    return recorder, guard, messages


def _nbytes(tensors) -> int:
    local = (t.to_local() if hasattr(t, "to_local") else t for t in tensors)
    return sum(t.numel() * t.element_size() for t in local)


def _state_bytes(trainer) -> dict:
    """The bytes this rank holds now: parameters, gradients, optimizer states."""
    params = list(trainer.stage.parameters())
    optimizer = getattr(trainer, "optimizer", None)
    return {"parameters": _nbytes(params),
            "gradients": _nbytes(p.grad for p in params if p.grad is not None),
            "optimizer states": 0 if optimizer is None
            else optimizer_state_bytes(optimizer)}


def _one_step(trainer, module_name, tokens, options, found, ctx, cfg):
    """Run one trainer.step inside a timeline.Watch: the order of the stage's
    forwards and backwards (and, when memory is measured, its bytes); note the tokens
    the stage read (first stage) and the parameters left with no gradient."""
    read = []

    def note_tokens(_module, args):
        if args and torch.is_tensor(args[0]) and not args[0].is_floating_point():
            read.append(args[0].detach().cpu().clone())   # the first stage's input

    hook = trainer.stage.register_forward_pre_hook(note_tokens)
    try:
        with timeline.Watch(trainer.stage, ctx.rank, ctx.device,
                            saved_bytes=options.memory) as watch:
            loss = call_learner(trainer.step, module_name, tokens)
    finally:
        hook.remove()
    found["orders"].append(watch.order)
    found["read"].append(read)
    found["no_grad"] = sorted(set(found["no_grad"]) | {
        name for name, p in layout.canonical(
            dict(trainer.stage.named_parameters()), _known_names(cfg)).items()
        if p.requires_grad and p.grad is None})
    if options.memory:
        found["activations"] = max(found.get("activations", 0), watch.peak_bytes)
        found["held"] = max(found.get("held", 0), watch.peak_held)
    return loss


def mesh_groups(ctx, cfg) -> dict:
    """{"pp", "dp", "tp": this rank's group} on the (pp, dp, tp) mesh (layout's)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(ctx.device.type, (cfg.pp, cfg.dp, cfg.tp),
                            mesh_dim_names=("pp", "dp", "tp"))
    return {dim: mesh.get_group(dim) for dim in ("pp", "dp", "tp")}


def _shard_optimizer(trainer, ctx, cfg, module_name: str, found: dict) -> None:
    """Give the Trainer the learner's ShardedOptimizer; record the norms its
    global_grad_norm returns (``found["norms"]``)."""
    module = importlib.import_module(module_name)
    real, found["norms"] = module.global_grad_norm, []

    def recorded(*args, **kwargs):
        value = real(*args, **kwargs)
        found["norms"].append(float(value))
        return value

    module.global_grad_norm = recorded
    trainer.optimizer = call_learner(module.ShardedOptimizer, module_name,
                                     list(trainer.stage.parameters()),
                                     mesh_groups(ctx, cfg), cfg, trainer.stage)


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of the optimizer states ``optimizer`` keeps: its own, or those of the
    torch optimizers it holds (a ZeRO-1 wrapper keeps one over its share)."""
    inner = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else [
        value for value in vars(optimizer).values()
        if isinstance(value, torch.optim.Optimizer)]
    return _nbytes(v for opt in inner for state in opt.state.values()
                   for v in state.values()
                   if torch.is_tensor(v) and v.dim() > 0)   # not Adam's step counter


def run_trainer(ctx, module_name: str, cfg, batches: torch.Tensor,
                options: Options = Options()) -> dict:
    """Rank worker: build the learner's ``Trainer(ctx, cfg)`` and train on ``batches``
    (steps, B, T + 1), one ``trainer.step`` each.

    Returns this rank's losses, its weights after every step (``snapshots``) or only
    at the end (``weights``), seconds per step after ``warmup``, the collectives
    (``comm``), the messages (``messages``), how many buckets were never waited
    for (``unwaited``), the stage's order of forwards and backwards in each step
    (``orders``, timeline.Watch's), the token micro-batches it read (``read``: the
    first stage's inputs) and the parameters that never got a gradient (``no_grad``).
    """
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    found = {"rank": ctx.rank, "losses": [], "snapshots": [], "unwaited": 0,
             "orders": [], "read": [], "no_grad": []}
    with ExitStack() as stack:
        recorder, guard, messages = recorders(ctx, options, stack)
        module = importlib.import_module(module_name)
        trainer = call_learner(module.Trainer, module_name, ctx, cfg)
        if options.sharded:
            _shard_optimizer(trainer, ctx, cfg, options.sharded, found)
        start = time.perf_counter()
        for step, tokens in enumerate(batches):
            if step == options.warmup:
                train.synchronize(ctx.device)
                start = time.perf_counter()
            if guard is not None:
                guard.phase = step
            recorder.phase = step
            if options.lr is not None:
                for group in trainer.optimizer.param_groups:
                    group["lr"] = options.lr[step]
            loss = _one_step(trainer, module_name, tokens.to(ctx.device), options,
                             found, ctx, cfg)
            found["unwaited"] += recorder.flush()
            found["losses"].append(None if loss is None else float(loss))
            if options.snapshots:
                found["snapshots"].append(local_weights(trainer.stage, cfg))
        train.synchronize(ctx.device)   # a GPU's queue has run by now
        timed = max(1, len(batches) - options.warmup)
        found["seconds_per_step"] = (time.perf_counter() - start) / timed
    found.update(weights=local_weights(trainer.stage, cfg), comm=recorder.log,
                 messages=messages,
                 optimizer_bytes=optimizer_state_bytes(trainer.optimizer),
                 param_bytes=_nbytes(trainer.stage.parameters()))
    if options.memory:
        found["memory"] = dict(_state_bytes(trainer), activations=found["activations"])
    return found
