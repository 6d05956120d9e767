"""Checks for lab 07 (ZeRO, FSDP2, activation checkpointing): the per-stage bytes
formula, the ZeRO-1 worker, the FSDP2 wrapping, the checkpointed forward.

The program checks launch the learner's module on 2 gloo ranks through a rank-side
harness that first trains the DDP + Adam reference (``sharded.ddp_adam``) on the same
data, then the learner's ``train``, and returns plain numbers: the weights, the
bytes each rank holds and which collectives it called, so that a hint can name the
classic mistake (no all-gather, Adam over the whole model, fully_shard on the root
only, a DTensor's global size counted as local).
"""

import importlib
import math
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit import memory_probe, models
from labkit.labs.sharding import sharded, sharding_memory
from labkit.checks._core import ExerciseFailed, attempt, passed
from labkit.checks._reference import use_reference
from labkit.checks._solved import has_passed, solved
from labkit.checks._programs import first_difference, launch_program, load_program
from labkit.messages import N_, _

__all__ = ["use_reference", "solved", "has_passed",
           "bytes_per_rank", "zero1_worker", "fsdp_worker",
           "checkpointed_forward", "zero1_harness", "fsdp_harness", "TOLERANCE"]

TOLERANCE = 1e-5   # sharded vs DDP, every parameter (measured here: 0.0)
CONFIG = sharded.TrainConfig(steps=4, global_batch=32, width=32, depth=3)
_KIND_SHARDED_FROM = {"optimizer states": 1, "gradients": 2, "parameters": 3}
_kind_name = sharding_memory.kind_name   # one of KINDS in the learner's language


# ---------------------------------------------------------------- exercise 7.1


def _formula_hint(kind: str, stage: int, got, want, full) -> str:
    """Name the mistake for one kind at one stage."""
    first = _KIND_SHARDED_FROM[kind]
    if math.isclose(got, full) and stage >= first:
        return _("At stage {stage} the {kind} are sharded (from ZeRO-{first} on): each "
                 "rank keeps 1/N of them. The stages add up.").format(
                     stage=stage, kind=_kind_name(kind), first=first)
    if not math.isclose(got, full) and stage < first:
        return _("The {kind} are whole on every rank until ZeRO-{first}; stage {stage} "
                 "keeps all of them.").format(kind=_kind_name(kind), first=first,
                                              stage=stage)
    return _("Bytes of a kind: num_params x its bytes per value (/ N when sharded).")


def bytes_per_rank(fn) -> None:
    """Check ``fn(num_params, world_size, stage, param_bytes, grad_bytes,
    optimizer_bytes) -> {kind: bytes}`` against the ZeRO paper's accounting."""
    name = "bytes_per_rank"
    cases = [(7_500_000_000, 64, s, 2, 2, 12) for s in range(4)] + [
        (1000, 4, s, 4, 4, 8) for s in range(4)] + [(12_000_000_000, 1, 3, 2, 2, 12)]
    for case in cases:
        got = attempt(name, fn, *case)
        want = sharding_memory.zero_bytes_per_rank(*case)
        full = sharding_memory.zero_bytes_per_rank(*case[:2], 0, *case[3:])
        where = _("num_params={num_params:,}, world_size={world_size}, "
                  "stage={stage}, bytes per value "
                  "{param_bytes}/{grad_bytes}/{optimizer_bytes}").format(
                      num_params=case[0], world_size=case[1], stage=case[2],
                      param_bytes=case[3], grad_bytes=case[4], optimizer_bytes=case[5])
        if not isinstance(got, dict) or set(got) != set(want):
            raise ExerciseFailed(_("{name}: for {where} return a dict with the keys "
                                   "{keys}, got {got!r}.").format(
                                       name=name, where=where, keys=list(want),
                                       got=got))
        for kind in sharding_memory.KINDS:
            if not isinstance(got[kind], (int, float)) or not math.isclose(
                    got[kind], want[kind], rel_tol=1e-9):
                raise ExerciseFailed(_(
                    "{name}: for {where}, {kind}: expected {want:,.6g} bytes, "
                    "got {got!r}. {hint}").format(
                        name=name, where=where, kind=_kind_name(kind),
                        want=want[kind], got=got[kind],
                        hint=_formula_hint(kind, case[2], got[kind], want[kind],
                                           full[kind])))
    for bad in (4, -1):
        try:
            fn(1000, 2, bad, 2, 2, 12)
        except ValueError:
            continue
        except NotImplementedError:
            raise ExerciseFailed(_("{name}: not done yet.").format(name=name)) from None
        raise ExerciseFailed(_("{name}: stage={stage} returned without an error: raise "
                               "ValueError naming the stage (only 0, 1, 2, 3 exist)."
                               ).format(name=name, stage=bad))
    paper = sharding_memory.zero_bytes_per_rank(7.5e9, 64, 3)
    passed(name, _("7.5 B parameters on 64 GPUs, ZeRO-3: {gb_per_gpu:.2f} GB per GPU "
                   "(the ZeRO paper's 1.9 GB), from 120 GB.").format(
                       gb_per_gpu=sum(paper.values()) / 1e9))


# ---------------------------------------------------------------- rank-side harnesses

# Every spelling of the collectives that keep ZeRO's shards in step. The counts only
# explain a wrong result; they never reject a right one. (torch 2.14 renamed
# all_gather_into_tensor / reduce_scatter_tensor to *_single; both are counted.)
_GRAD_SYNC = ("all_reduce", "reduce_scatter_single", "reduce_scatter_tensor",
              "reduce_scatter")
_PARAM_SYNC = ("all_gather_single", "all_gather_into_tensor", "all_gather", "broadcast")
_NOT_CHECKED = N_("Not checked here: the CUDA/NCCL branch (the check runs 2 gloo CPU "
                  "ranks).")   # translated where used: _(_NOT_CHECKED)


@contextmanager
def _calls(counts: dict):
    """Count calls of the collectives that keep ZeRO's shards in step, by name."""
    saved = {n: getattr(dist, n) for n in _GRAD_SYNC + _PARAM_SYNC if hasattr(dist, n)}

    def spy(name, original):
        def counted(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return original(*args, **kwargs)
        return counted

    for name, original in saved.items():
        setattr(dist, name, spy(name, original))
    try:
        yield counts
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def zero1_harness(ctx, module_name: str, cfg: sharded.TrainConfig) -> dict:
    """Rank worker: DDP + Adam, then the learner's ZeRO-1 ``train``; plain results."""
    reference = sharded.ddp_adam(ctx, cfg)
    module = importlib.import_module(module_name)
    counts: dict = {}
    with _calls(counts):
        model, optimizer = module.train(ctx, cfg)
    numel = sum(p.numel() for p in model.parameters())
    return {"reference": reference, "weights": sharded.weights(model), "calls": counts,
            "bytes": sharding_memory.state_bytes(model, optimizer), "numel": numel}


def fsdp_harness(ctx, module_name: str, cfg: sharded.TrainConfig) -> dict:
    """Rank worker: DDP + Adam, then the learner's FSDP2 ``train``; plain results."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_model_state_dict)
    from torch.distributed.fsdp import FSDPModule

    reference = sharded.ddp_adam(ctx, cfg)
    module = importlib.import_module(module_name)
    model, optimizer = module.train(ctx, cfg)
    inner = getattr(optimizer, "optim", optimizer)
    steps = [v for state in inner.state.values() for v in state.values()
             if torch.is_tensor(v) and v.dim() == 0]   # Adam's step counters
    full = get_model_state_dict(   # all-gathered: every rank gets every tensor
        model, options=StateDictOptions(full_state_dict=True))
    return {"reference": reference,
            "weights": {k: v.detach().cpu() for k, v in full.items()},
            "fsdp_modules": [n for n, m in model.named_modules()
                             if isinstance(m, FSDPModule)],
            "yours": module.local_bytes(model, optimizer),
            "measured": sharding_memory.state_bytes(model, optimizer),
            "step_bytes": sum(t.numel() * t.element_size() for t in steps)}


# ---------------------------------------------------------------- exercise 7.2


def _check_ranges(name: str, shard_range) -> None:
    """Call the learner's ``shard_range`` for each rank: equal, contiguous, covering."""
    for numel, world_size in [(10, 2), (10, 4), (7, 3), (12, 4), (5, 1)]:
        ranges = [attempt(name, shard_range, numel, r, world_size)
                  for r in range(world_size)]
        where = _("shard_range({numel}, rank, {world_size}) gave {ranges}").format(
            numel=numel, world_size=world_size, ranges=ranges)
        if any(not isinstance(r, (tuple, list)) or len(r) != 2 for r in ranges):
            raise ExerciseFailed(_("{name}: {where}: return a pair (start, stop)."
                                   ).format(name=name, where=where))
        if len({stop - start for start, stop in ranges}) > 1:
            raise ExerciseFailed(_("{name}: {where}: the slices must have the same "
                                   "length (all_gather needs equal shards): pad the "
                                   "flat vector up to a multiple of world_size."
                                   ).format(name=name, where=where))
        if ranges[0][0] != 0 or any(a[1] != b[0] for a, b in zip(ranges, ranges[1:])):
            raise ExerciseFailed(_("{name}: {where}: rank r's slice must start where "
                                   "rank r-1's stops, from 0.").format(name=name,
                                                                        where=where))
        if ranges[-1][1] < numel:
            raise ExerciseFailed(_("{name}: {where}: the slices end at {end} "
                                   "and miss elements up to {numel}: round the length "
                                   "up (ceil(numel / world_size)), not down.").format(
                                       name=name, where=where, end=ranges[-1][1],
                                       numel=numel))
        if ranges[-1][1] - numel >= world_size:
            raise ExerciseFailed(_("{name}: {where}: more padding than needed: each "
                                   "slice has ceil(numel / world_size) elements."
                                   ).format(name=name, where=where))


def _explain_zero1(text: str) -> str | None:
    if "all_gather" in text and ("size" in text or "numel" in text):
        return _("The all-gather's output must be world_size times the shard: gather "
                 "into the padded flat vector, every rank's shard the same length.")
    if "does not require grad" in text or "can't optimize a non-leaf" in text:
        return _("The shard must be a leaf that requires grad: "
                 "flat[start:stop].clone().requires_grad_(True).")
    return None


def _zero1_weights_hint(result: dict) -> str:
    """Name what makes this rank's weights differ from DDP + Adam."""
    calls = result["calls"]
    if not any(calls.get(n) for n in _GRAD_SYNC):
        return _("No all_reduce (or reduce_scatter) was called: each rank stepped its "
                 "slice with its own gradient. Average the gradients over the ranks "
                 "first, as DDP does.")
    if not any(calls.get(n) for n in _PARAM_SYNC):
        return _("No all-gather was called: each rank updated only its own slice and "
                 "the rest of its model stayed where it started. All-gather every "
                 "rank's updated shard and copy it into the parameters.")
    return _("Step the shard with the averaged gradient's slice [start:stop], then "
             "all-gather the shards into a flat vector and copy it into the model's "
             "parameters (vector_to_parameters), under torch.no_grad().")


def zero1_worker(path="zero1_worker.py", world_size: int = 2) -> None:
    """Check the learner's ZeRO-1: DDP + Adam's weights, 1/N of Adam's state each."""
    name = "zero1_worker"
    module = load_program(path)
    _check_ranges(name, module.shard_range)
    ranks = launch_program(
        name, zero1_harness, world_size, args=(module.__name__, CONFIG), timeout=60,
        explain=_explain_zero1, module=module.__name__,
        hang_hint=_("Does every rank call the same all_reduce and all-gather, with "
                    "tensors of the same size?"))
    numel = ranks[0]["numel"]
    share = 12 * math.ceil(numel / world_size)   # fp32 master + m + v per value
    for rank, result in enumerate(ranks):
        held = result["bytes"]["optimizer states"]
        if held > 1.1 * share:
            raise ExerciseFailed(_(
                "{name}: rank {rank} holds {held:,} bytes of optimizer state; its "
                "1/{world_size} share is {share:,.0f} (master copy + m + v of "
                "{values:,} values). Adam keeps state for "
                "everything it steps: give it only this rank's shard, not "
                "model.parameters().").format(
                    name=name, rank=rank, held=held, world_size=world_size,
                    share=share, values=math.ceil(numel / world_size)))
        gap = first_difference(result["reference"]["weights"], result["weights"],
                               TOLERANCE)
        if gap:
            raise ExerciseFailed(_(
                "{name}: after {steps} steps rank {rank}'s {param} differs "
                "from DDP + Adam by {gap:.2e} (tolerance {tolerance:g}). {hint}"
                ).format(
                    name=name, steps=CONFIG.steps, rank=rank, param=gap[0], gap=gap[1],
                    tolerance=TOLERANCE, hint=_zero1_weights_hint(result)))
    worst = max(models.max_difference(r["reference"]["weights"], r["weights"])
                for r in ranks)
    passed(name, _("{world_size} ranks equal DDP + Adam after {steps} steps (max "
                   "gap {worst:.1e}, tolerance {tolerance:g}); each holds {share:,} "
                   "bytes of optimizer state "
                   "(master + m + v of its 1/{world_size}), DDP {ddp_bytes:,} (m + v). "
                   "{not_checked}").format(
                       world_size=world_size, steps=CONFIG.steps, worst=worst,
                       tolerance=TOLERANCE, share=share, ddp_bytes=8 * numel,
                       not_checked=_(_NOT_CHECKED)))


# ---------------------------------------------------------------- exercise 7.3


def _explain_fsdp(text: str) -> str | None:
    if "Invariant encountered" in text:
        return _("fully_shard was called on the root before the blocks: the blocks' "
                 "parameters were DTensors already. Call it bottom-up: every block "
                 "first, then the root.")
    if "got mixed torch.Tensor and DTensor" in text:
        return _("Some parameters are plain tensors and some DTensors: call "
                 "fully_shard on the root too, after the blocks.")
    if "'NoneType'" in text:
        return _("shard_model must apply fully_shard in place and return the model.")
    return None


def _check_wrapping(name: str, result: dict, depth: int) -> None:
    """The root and every block must be in FSDP groups of their own.

    A block counts as sharded on its own when it, or modules inside it, were given
    to ``fully_shard`` (per block as the docs do it, or finer, per layer).
    """
    wrapped = set(result["fsdp_modules"])
    blocks = {f"blocks.{i}" for i in range(depth)
              if not any(w == f"blocks.{i}" or w.startswith(f"blocks.{i}.")
                         for w in wrapped)}
    if "" not in wrapped:
        raise ExerciseFailed(_(
            "{name}: the root model is not an FSDPModule (wrapped: "
            "{wrapped}): embed and head stay plain tensors on every rank, "
            "their gradients are never averaged, and clip_grad_norm_ or a fused Adam "
            "fails with 'got mixed torch.Tensor and DTensor'. Call "
            "fully_shard(model, mesh=mesh) after the blocks.").format(
                name=name, wrapped=sorted(wrapped)))
    if blocks:
        raise ExerciseFailed(_(
            "{name}: only {wrapped} was wrapped, not the blocks "
            "{blocks}. fully_shard on the root only makes one "
            "group: the whole model is all-gathered at once and stays unsharded "
            "through forward and backward, so the peak memory is DDP's. Call "
            "fully_shard on each block first, then on the root.").format(
                name=name, wrapped=sorted(wrapped) or _("nothing"),
                blocks=sorted(blocks)))


def _check_local_bytes(name: str, rank: int, result: dict, world_size: int) -> None:
    yours, measured = result["yours"], result["measured"]
    if not isinstance(yours, dict) or set(yours) != set(sharding_memory.KINDS):
        raise ExerciseFailed(_("{name}: local_bytes must return a dict with the keys "
                               "{keys}, got {got!r}.").format(
                                   name=name, keys=list(sharding_memory.KINDS),
                                   got=yours))
    full = result["reference"]["bytes"]
    for kind in sharding_memory.KINDS:
        if yours[kind] == measured[kind] or (   # Adam's step counters: either way
                kind == "optimizer states"
                and yours[kind] == measured[kind] + result["step_bytes"]):
            continue
        hint = _("Sum t.to_local().numel() * t.element_size() over the tensors.")
        if yours[kind] == full[kind]:
            hint = _("That is the whole model's size: a DTensor's numel() is its "
                     "global size. Count its local shard: p.to_local().numel().")
        elif kind == "optimizer states":
            hint = _("Adam's state per parameter: exp_avg and exp_avg_sq (DTensors), "
                     "local shards (the scalar step counters may be counted or not).")
        raise ExerciseFailed(_("{name}: rank {rank} holds {held:,} bytes of "
                               "{kind}, local_bytes said {yours!r}. {hint}").format(
                                   name=name, rank=rank, held=measured[kind],
                                   kind=_kind_name(kind), yours=yours[kind], hint=hint))


def fsdp_worker(path="fsdp_worker.py", world_size: int = 2) -> None:
    """Check the learner's FSDP2 wrapping: DDP's weights, per-block groups, bytes."""
    name = "fsdp_worker"
    module = load_program(path)
    ranks = launch_program(
        name, fsdp_harness, world_size, args=(module.__name__, CONFIG), timeout=60,
        explain=_explain_fsdp, module=module.__name__,
        hang_hint=_("Is fully_shard called on every rank, on the same modules?"))
    for rank, result in enumerate(ranks):
        _check_wrapping(name, result, CONFIG.depth)
        gap = first_difference(result["reference"]["weights"], result["weights"],
                               TOLERANCE)
        if gap:
            raise ExerciseFailed(_(
                "{name}: after {steps} steps {param} differs from DDP + Adam "
                "by {gap:.2e} (tolerance {tolerance:g}): build the optimizer after "
                "fully_shard, from model.parameters() (the DTensor shards).").format(
                    name=name, steps=CONFIG.steps, param=gap[0], gap=gap[1],
                    tolerance=TOLERANCE))
        _check_local_bytes(name, rank, result, world_size)
    mine = sum(ranks[0]["measured"].values())
    ddp = sum(ranks[0]["reference"]["bytes"].values())
    worst = max(models.max_difference(r["reference"]["weights"], r["weights"])
                for r in ranks)
    passed(name, _("DDP + Adam's weights (max gap {worst:.1e}, tolerance "
                   "{tolerance:g}); each rank holds {mine:,} bytes of model state, "
                   "DDP {ddp:,} ({fraction:.0%}). {not_checked}").format(
                       worst=worst, tolerance=TOLERANCE, mine=mine, ddp=ddp,
                       fraction=mine / ddp, not_checked=_(_NOT_CHECKED)))


# ---------------------------------------------------------------- exercise 7.4


def _forward(name: str, fn, model, images):
    """Run the learner's forward; a shape error names the classic cause (no flatten)."""
    try:
        return attempt(name, fn, model, images)
    except ExerciseFailed as failed:
        err = failed.__context__               # what the learner's code raised
        if not isinstance(err, RuntimeError) or isinstance(err, NotImplementedError):
            raise                              # the stub, or not a shape error
        if "cannot be multiplied" in str(err):
            hint = _("`model.embed` is nn.Linear(784, {width}) and the images are "
                     "(B, 1, 28, 28): give it images.flatten(1), shape (B, 784), as "
                     "BlockMLP.forward does.").format(width=model.embed.out_features)
        else:
            hint = _("Run embed (on images.flatten(1)), each block, then head, as "
                     "model(images) does.")
        raise ExerciseFailed(_("{name}: your forward raised RuntimeError: {error}. "
                               "{hint}").format(name=name, error=err, hint=hint)
                             ) from None


def checkpointed_forward(fn) -> None:
    """Check ``fn(model, images) -> logits``: same logits and gradients, less memory."""
    name = "forward_checkpointed"
    torch.manual_seed(0)
    model = sharded.block_mlp(width=64, depth=8)
    images, labels = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    logits = _forward(name, fn, model, images)
    if not torch.is_tensor(logits) or logits.shape != (64, 10):
        raise ExerciseFailed(_("{name}: return the logits, shape (64, 10), got "
                               "{got!r}.").format(name=name,
                                                  got=getattr(logits, "shape", logits)))
    plain = {}
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(images), labels).backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    F.cross_entropy(_forward(name, fn, model, images), labels).backward()
    for n, p in model.named_parameters():
        if p.grad is None:
            raise ExerciseFailed(_(
                "{name}: {param} got no gradient. With use_reentrant=True a "
                "checkpointed segment whose inputs do not require grad gives its "
                "weights none ('None of the inputs have requires_grad=True'): use "
                "use_reentrant=False, and checkpoint the blocks.").format(name=name,
                                                                          param=n))
        if not torch.allclose(p.grad, plain[n], atol=1e-6):
            raise ExerciseFailed(_("{name}: {param}'s gradient differs from the plain "
                                   "forward's: run the same layers, in the same order."
                                   ).format(name=name, param=n))
    without = memory_probe.step_memory(model, images, labels)
    with_ = memory_probe.step_memory(model, images, labels, forward=fn)
    if with_["after_forward"] > 0.5 * without["after_forward"]:
        raise ExerciseFailed(_(
            "{name}: {saved_mib:.2f} MiB of activations are "
            "saved when backward starts, like without checkpointing "
            "({without_mib:.2f} MiB): run each block through "
            "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).").format(
                name=name, saved_mib=with_["after_forward"] / 2**20,
                without_mib=without["after_forward"] / 2**20))
    if with_["peak"] > 0.6 * without["peak"]:
        raise ExerciseFailed(_(
            "{name}: the peak is {peak_mib:.2f} MiB, close to the "
            "{without_mib:.2f} MiB without checkpointing: one segment "
            "for all blocks recomputes all of them at once in backward. Checkpoint "
            "each block on its own.").format(name=name, peak_mib=with_["peak"] / 2**20,
                                             without_mib=without["peak"] / 2**20))
    passed(name, _("same gradients; {peak_mib:.2f} MiB at the peak "
                   "instead of {without_mib:.2f} MiB.").format(
                       peak_mib=with_["peak"] / 2**20,
                       without_mib=without["peak"] / 2**20))
