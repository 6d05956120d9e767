"""Checks for lab 08 (tensor parallelism): the Megatron MLP from scratch, a transformer
block split with ``parallelize_module``, the latency model, and data x tensor
parallelism on a 2 x 2 mesh.

The program checks launch the learner's module on gloo ranks (through ``run_learner``)
and compare with ``tensor_parallel.unsplit``: the same model run whole in this process.
The hint names the classic mistake the numbers show: partial sums never added up, a
bias counted N times, an input gradient never all-reduced (or all-reduced twice), a
layer split along the wrong dimension, a wrong plan, TP pairs that cross nodes.
"""

import fnmatch
import importlib
import logging

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from labkit.labs.tensor_parallel import latency_model, tensor_parallel as tp
from labkit.checks._core import NOT_DONE, ExerciseFailed, attempt, passed
from labkit.checks._reference import use_reference
from labkit.checks._solved import has_passed, solved
from labkit.checks._programs import (first_difference, launch_program, load_program,
                                     torch_refused)
from labkit.messages import N_, _

__all__ = ["use_reference", "solved", "has_passed",
           "tp_mlp", "tp_block", "request_seconds", "dp_tp", "run_learner"]

TOLERANCE = 1e-5   # split vs whole, every tensor (float rounding is ~1e-7)


def _close(a, b) -> bool:
    return a.shape == b.shape and _gap(a, b) <= TOLERANCE


def _gap(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def run_learner(ctx, module_name: str, *args):
    """Rank worker: run the learner module's ``run(ctx, *args)``.

    torch's own NotImplementedError (a DTensor passed to a c10d collective, a style
    applied to a module it cannot split) is re-raised as RuntimeError, with the
    learner's line, so that it is not mistaken for the exercise's stub.
    """
    # A failed DTensor shape check also logs fake-tensor tracebacks: keep ranks quiet.
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    module = importlib.import_module(module_name)
    try:
        return module.run(ctx, *args)
    except NotImplementedError as err:
        if not str(err):
            raise   # the stub: "not done yet"
        raise torch_refused(err, module_name) from None


# ---------------------------------------------------------------- exercise 8.1


def _blocks(mlp, rank: int, n: int) -> dict:
    """Rank ``rank``'s shards of ``mlp``'s weights."""
    weights = {key: p.detach() for key, p in mlp.named_parameters()}
    return tp.mlp_blocks(weights, rank, n)


_SHAPE_HINTS = {   # translated where used: _(_SHAPE_HINTS[key])
    "fc1.weight": N_("fc1 must keep a block of its OUTPUT features (column-parallel). "
                     "nn.Linear stores weight as (out_features, in_features), so that "
                     "block is a block of rows: weight[rank*k:(rank+1)*k]."),
    "fc1.bias": N_("fc1's bias goes with its output features: the same block as the "
                   "rows."),
    "fc2.weight": N_("fc2 must keep the block of its INPUT features that matches fc1's "
                     "output block (row-parallel): the columns "
                     "weight[:, rank*k:(rank+1)*k]."),
    "fc2.bias": N_("fc2's bias is not split: every rank keeps it whole and adds it "
                   "once, after the all-reduce."),
}


def _canonical(named: dict) -> dict:
    """Name each shard as the unsplit MLP does, whatever holds it.

    ``fc1.weight``, ``fc1.linear.weight`` (an nn.Linear kept inside) and
    ``fc1.shard.weight`` all mean fc1's weight; a name that would collide stays as
    it is.
    """
    found = {}
    for key, value in named.items():
        parts = key.split(".")
        short = (f"{parts[0]}.{parts[-1]}" if parts[0] in ("fc1", "fc2")
                 and parts[-1] in ("weight", "bias") else key)
        found[key if short in found else short] = value
    return found


def _check_shards(name: str, module, mlp, n: int) -> None:
    """Build the learner's ParallelMLP here, rank by rank; compare its shards."""
    for rank in range(n):
        model = attempt(name, module.ParallelMLP, mlp, rank, n)
        got = _canonical({key: p.detach() for key, p in model.named_parameters()})
        for key, want in _blocks(mlp, rank, n).items():
            if key not in got:
                raise ExerciseFailed(_(
                    "{name}: ParallelMLP on rank {rank} has no parameter {key} (it "
                    "has {found}): keep each shard as an nn.Parameter (named "
                    "weight and bias, directly or inside an nn.Linear).").format(
                        name=name, rank=rank, key=key, found=sorted(got)))
            if got[key].shape != want.shape:
                raise ExerciseFailed(_(
                    "{name}: on rank {rank} of {n}, {key} has shape "
                    "{got_shape}, expected {want_shape}. {hint}").format(
                        name=name, rank=rank, n=n, key=key,
                        got_shape=tuple(got[key].shape), want_shape=tuple(want.shape),
                        hint=_(_SHAPE_HINTS[key])))
            if torch.equal(got[key], want):
                continue
            others = [r for r in range(n)
                      if torch.equal(got[key], _blocks(mlp, r, n)[key])]
            hint = (_("That is rank {other}'s block: rank r keeps block r.").format(
                        other=others[0])
                    if others else _("Copy the full layer's values: "
                                     "full.weight.detach()[...].clone()."))
            if key == "fc2.bias" and torch.allclose(got[key] * n, want):
                hint = _(_SHAPE_HINTS[key])
            raise ExerciseFailed(_("{name}: on rank {rank}, {key} holds other values "
                                   "than the full MLP's block. {hint}").format(
                                       name=name, rank=rank, key=key, hint=hint))


def _partial(mlp, x, rank: int, n: int):
    """Rank ``rank``'s partial output (no bias) and the input gradient through it."""
    w = _blocks(mlp, rank, n)
    x = x.detach().clone().requires_grad_()
    out = F.linear(F.gelu(F.linear(x, w["fc1.weight"], w["fc1.bias"])), w["fc2.weight"])
    (out * tp.probe(out.shape)).sum().backward()
    return out.detach(), x.grad


def _output_hint(got, mlp, x, want, rank: int, n: int) -> str:
    bias = mlp.fc2.bias.detach()
    mine, _unused = _partial(mlp, x, rank, n)
    if _close(got, mine + bias) or _close(got, mine):
        return _("It is this rank's own partial sum: off by exactly the other ranks' "
                 "share (max {gap:.3g}). After fc2, all-reduce the partial "
                 "outputs (ReduceFromParallel.forward), then add the bias.").format(
                     gap=_gap(got, want))
    if _close(got, want + (n - 1) * bias):
        return _("The bias is counted {n} times: each rank added it before the sum. "
                 "Add fc2's bias once, after the all-reduce.").format(n=n)
    if _close(got, want - bias):
        return _("fc2's bias is missing: add it once, after the all-reduce.")
    if _close(got, mlp(n * x).detach()):
        return _("That is the MLP of {n} x the input: f's forward must return x "
                 "unchanged (it is already whole on every rank); f all-reduces only in "
                 "backward.").format(n=n)
    return _("Column-parallel fc1, GELU, row-parallel fc2, all-reduce, bias: in that "
             "order.")


def _twice(n: int) -> str:
    return _("the output's gradient was all-reduced: g's backward must return it "
             "unchanged (every rank already holds it whole; summing gives "
             "{n}x).").format(n=n)


def _too_big(n: int) -> str:
    return _("It is {n}x too big: {why}").format(n=n, why=_twice(n))


def _input_grad_hint(got, mlp, x, want, rank: int, n: int) -> str:
    _unused, own = _partial(mlp, x, rank, n)
    if _close(got, own):
        return _("It is only this rank's share: f's backward must all-reduce it (each "
                 "rank saw the paths through its own hidden features only).")
    if _close(got, n * want):
        return _too_big(n)
    return _("Check f (CopyToParallel) and g (ReduceFromParallel).")


def _check_mlp_rank(name: str, rank: int, got: dict, mlp, x, want: dict,
                    n: int) -> None:
    if not _close(got["out"], want["out"]):
        raise ExerciseFailed(_(
            "{name}: rank {rank}'s output differs from the unsplit MLP by "
            "{gap:.3g}. {hint}").format(
                name=name, rank=rank, gap=_gap(got["out"], want["out"]),
                hint=_output_hint(got["out"], mlp, x, want["out"], rank, n)))
    if not _close(got["x_grad"], want["x_grad"]):
        raise ExerciseFailed(_(
            "{name}: rank {rank}'s input gradient differs from the unsplit MLP's by "
            "{gap:.3g}. {hint}").format(
                name=name, rank=rank, gap=_gap(got["x_grad"], want["x_grad"]),
                hint=_input_grad_hint(got["x_grad"], mlp, x, want["x_grad"], rank, n)))
    blocks = tp.mlp_blocks(want["grads"], rank, n)
    got = dict(got, grads=_canonical(got["grads"]))
    gap = first_difference(blocks, got["grads"], TOLERANCE)
    if gap:
        bigger = (gap[0] in got["grads"] and gap[0] in blocks
                  and _close(got["grads"][gap[0]], n * blocks[gap[0]]))
        raise ExerciseFailed(_(
            "{name}: rank {rank}'s gradient of {param} differs from the unsplit "
            "MLP's block by {gap:.3g}. {hint}").format(
                name=name, rank=rank, param=gap[0], gap=gap[1],
                hint=_too_big(n) if bigger else _(
                    "Gradients reach the weights through f and g: use them (.apply) "
                    "in forward.")))


def tp_mlp(path="tp_mlp.py", world_size: int = 2, dim: int = 16, hidden: int = 64,
           batch: int = 8) -> None:
    """Check the learner's Megatron MLP on ``world_size`` ranks against the whole."""
    name = "tp_mlp"
    module = load_program(path)
    torch.manual_seed(0)
    mlp, x = tp.MLP(dim, hidden), torch.randn(batch, dim)
    _check_shards(name, module, mlp, world_size)
    ranks = launch_program(
        name, run_learner, world_size, args=(module.__name__, mlp.state_dict(), x),
        module=module.__name__, timeout=60,
        hang_hint=_("Does every rank all-reduce in the same places (forward: g, "
                    "backward: f)?"))
    want = tp.unsplit(mlp, x)
    for rank, got in enumerate(ranks):
        _check_mlp_rank(name, rank, got, mlp, x, want, world_size)
    passed(name, _("{world_size} ranks x {features} hidden features = the "
                   "whole MLP: outputs, input gradient and every weight's gradient to "
                   "{tolerance:g}, with one all-reduce forward and one backward."
                   ).format(world_size=world_size, features=hidden // world_size,
                       tolerance=TOLERANCE))


# ---------------------------------------------------------------- exercise 8.2

_COLWISE = ("attn.q", "attn.k", "attn.v", "mlp.fc1")
_ROWWISE = ("attn.out", "mlp.fc2")
_DEFAULTS = {ColwiseParallel: ((Replicate(),), (Shard(-1),)),
             RowwiseParallel: ((Shard(-1),), (Replicate(),))}


def _style_hint(key: str, style) -> str:
    """Say what is wrong with the style the plan gives ``key`` ('' if nothing)."""
    want = ColwiseParallel if key in _COLWISE else RowwiseParallel
    if not isinstance(style, want):
        if key in ("attn.q", "attn.k", "attn.v"):
            return _("{key} must be ColwiseParallel: split by output features, each "
                     "rank gets whole heads and computes their attention alone. "
                     "Rowwise would give every rank partial sums of every head."
                     ).format(key=key)
        if key == "attn.out":
            return _("attn.out must be RowwiseParallel: its input (the heads) is "
                     "already split across ranks; each rank multiplies its heads' "
                     "features, then one all-reduce adds them up.")
        return _("{key} must be {style}: the MLP is column-parallel fc1, then "
                 "row-parallel fc2, as in exercise 8.1.").format(key=key,
                                                                 style=want.__name__)
    if not _same_layouts(style, want) or not style.use_local_output:
        return _("{key}: keep the default input_layouts/output_layouts (and "
                 "use_local_output=True). {style}'s defaults are exactly what "
                 "this block needs: Colwise takes a replicated input and leaves its "
                 "output sharded on the last dim, which is what Rowwise expects."
                 ).format(key=key, style=want.__name__)
    return ""


def _resolve(plan) -> dict:
    """Map each nn.Linear of tp.Block to the style ``plan`` gives it.

    Keys are matched as parallelize_module matches them: atom by atom with fnmatch
    ("attn.[qkv]", "mlp.*"); a Linear no key names is missing from the result.
    """
    found = {}
    for key, style in plan.items():
        atoms = key.split(".")
        for linear in _COLWISE + _ROWWISE:
            parts = linear.split(".")
            if len(parts) == len(atoms) and all(fnmatch.fnmatch(p, a)
                                                 for p, a in zip(parts, atoms)):
                found.setdefault(linear, style)
    return found


def _same_layouts(style, want) -> bool:
    """Are the style's layouts the defaults (Shard(2) of a (B, T, C) tensor is the
    default Shard(-1))?"""
    def norm(layouts):
        return tuple(Shard(-1) if isinstance(p, Shard) and p.dim in (2, -1) else p
                     for p in (layouts or ()))
    return (norm(style.input_layouts), norm(style.output_layouts)) == tuple(
        norm(d) for d in _DEFAULTS[want])


def _plan_hint(plan) -> str | None:
    """Say what looks wrong in the learner's plan (only to explain a wrong result)."""
    linear = _COLWISE + _ROWWISE
    if not isinstance(plan, dict):
        return _("block_plan() should return a dict {{name of an nn.Linear: "
                 "ColwiseParallel() or RowwiseParallel()}}, got {got_type}.").format(
                     got_type=type(plan).__name__)
    resolved = _resolve(plan)
    for key in plan:
        if not _resolve({key: None}):
            return _("{key!r} names no nn.Linear of tp.Block (those are "
                     "{linears}). Plain tensor parallelism splits only the "
                     "Linear layers; name each one (attn.q, not attn), and leave the "
                     "LayerNorms whole.").format(key=key, linears=", ".join(linear))
    missing = [key for key in linear if key not in resolved]
    if missing:
        return _("{missing} not in the plan: that layer stays whole on "
                 "every rank while its neighbours are split, so the shapes (or the "
                 "heads) no longer line up. Give every Linear of the block a style."
                 ).format(missing=", ".join(missing))
    for key in linear:
        hint = _style_hint(key, resolved[key])
        if hint:
            return hint
    return None


def _explain_block(traceback_text: str) -> str | None:
    if "is invalid for input of size" in traceback_text:
        return _("Attention reshapes q, k, v into (B, T, n_heads, head_dim), but "
                 "each rank now holds only 1/N of the features: after "
                 "parallelize_module set block.attn.n_heads //= mesh.size() (each rank "
                 "computes its own heads).")
    if "mixed torch.Tensor and DTensor" in traceback_text:
        return _("A layer returned a DTensor (use_local_output=False) that meets a "
                 "plain tensor in the residual add: keep use_local_output=True.")
    return None


def _check_split(name: str, rank: int, placements: dict) -> None:
    for key in _COLWISE + _ROWWISE:
        got, dim = placements.get(f"{key}.weight"), 0 if key in _COLWISE else 1
        if got != f"(Shard(dim={dim}),)":
            raise ExerciseFailed(_(
                "{name}: on rank {rank}, {key}.weight is {got}, expected Shard(dim="
                "{dim}) (the weight is (out, in)): was parallelize_module called with "
                "block_plan() on the mesh passed in?").format(
                    name=name, rank=rank, key=key, got=got, dim=dim))


def _block_problem(want: dict, ranks: list) -> str | None:
    """What differs between the learner's split block and the whole one (or None)."""
    for rank, got in enumerate(ranks):
        for differs, ours, theirs in [
                (N_("rank {rank}'s output differs from the unsplit block by "
                    "{gap:.3g}."), want["out"], got["out"]),
                (N_("rank {rank}'s input gradient differs from the unsplit block by "
                    "{gap:.3g}."), want["x_grad"], got["x_grad"])]:
            if not _close(theirs, ours):
                return _(differs).format(rank=rank, gap=_gap(theirs, ours))
        gap = first_difference(want["grads"], got["grads"], TOLERANCE)
        if gap:
            return _("rank {rank}'s gradient of {param} differs from the unsplit "
                     "block's by {gap:.3g}.").format(rank=rank, param=gap[0],
                                                     gap=gap[1])
    return None


def tp_block(path="tp_block.py", dim: int = 32, n_heads: int = 4, batch: int = 2,
             seq: int = 8) -> None:
    """Check the learner's split of tp.Block over 2 ranks: same results, split weights.

    The verdict comes from what the ranks computed (outputs, input gradient, every
    gradient) and how the weights ended up placed (Megatron's split: q, k, v, fc1 by
    rows, out and fc2 by columns); the plan is read only to explain a failure, so any
    spelling of a right plan passes (fnmatch keys, explicit default layouts, plans
    applied per submodule).
    """
    name = "tp_block"
    module = load_program(path)
    plan = attempt(name, module.block_plan)
    torch.manual_seed(0)
    block, x = tp.Block(dim, n_heads), torch.randn(batch, seq, dim)
    try:
        ranks = launch_program(
            name, run_learner, 2, args=(module.__name__, block.state_dict(), x,
                                        n_heads),
            module=module.__name__, explain=_explain_block, timeout=60)
    except ExerciseFailed as err:
        hint = _plan_hint(plan)
        if hint and NOT_DONE not in str(err) and _(NOT_DONE) not in str(err):
            raise ExerciseFailed(_("{error} In your plan: {hint}").format(
                error=err, hint=hint)) from None
        raise
    want = tp.unsplit(block, x)
    problem = _block_problem(want, ranks)
    if problem:
        hint = _plan_hint(plan)
        raise ExerciseFailed((_("{name}: {problem} {hint}") if hint
                              else _("{name}: {problem}")).format(
                                  name=name, problem=problem, hint=hint))
    for rank, got in enumerate(ranks):
        _check_split(name, rank, got["placements"])
    passed(name, _("{heads} heads per rank, q/k/v colwise, out rowwise, MLP "
                   "colwise/rowwise: outputs and gradients equal the whole block to "
                   "{tolerance:g}.").format(heads=n_heads // 2, tolerance=TOLERANCE))


# ---------------------------------------------------------------- exercise 8.3


def _latency_cases() -> list:
    a100, h200 = latency_model.DEVICES["A100 80GB"], latency_model.DEVICES["H200"]
    nvlink, ib = (latency_model.LINKS["NVLink 3 (DGX A100)"],
                  latency_model.LINKS["InfiniBand HDR (between DGX A100)"])
    mlp_stack = latency_model.Layers(4, 8e6, 4e6, 4096, allreduces=1)
    return [(latency_model.transformer(24, 2048), a100, nvlink),
            (latency_model.transformer(96, 12288, tokens=64), h200, ib),
            (mlp_stack, a100, nvlink)]


def _latency_hint(got: float, layers, device, link, n: int, split: str) -> str:
    """Compare ``got`` with the classic wrong answers; name the one it matches."""
    def close(value):
        return abs(got - value) <= 1e-9 * max(abs(value), 1e-12)

    whole = layers.num_layers * latency_model.layer_seconds(layers, device, 1)
    hop = link.message_seconds(layers.activation_bytes)
    split_layer = latency_model.layer_seconds(layers, device, n)
    reduce = link.allreduce_seconds(layers.activation_bytes, n)
    if n == 1:
        return _("On one device nothing is split and nothing is sent: the plain "
                 "compute.")
    wrong = {   # hints in English here, translated when returned
        "layerwise": [(whole / n + n * hop, N_("The layer-wise split does NOT divide "
                       "the compute: the devices work one after the other (lab 04).")),
                      (whole + (n - 1) * hop, N_("The answer must come back to device "
                       "0: n - 1 cuts plus the way back, n messages."))],
        "tensor": [(hop + layers.num_layers * split_layer, N_("Each layer ends with "
                    "all-reduce(s): link.allreduce_seconds(bytes, n), "
                    "layers.allreduces of them per layer.")),
                   (hop + layers.num_layers * (split_layer + reduce), N_("Count the "
                    "all-reduces per layer: layers.allreduces (2 in a transformer "
                    "block: after attention and after the MLP).")),
                   (hop + layers.num_layers * (whole / layers.num_layers
                                               + layers.allreduces * reduce),
                    N_("Each device holds 1/n of every layer: "
                       "latency_model.layer_seconds(layers, device, n).")),
                   (layers.num_layers * (split_layer + layers.allreduces * reduce),
                    N_("The request must first reach the other devices: one "
                       "message."))],
    }.get(split, [])
    for value, hint in wrong:
        if layers.allreduces == 1 and "Count the all-reduces" in hint:
            continue   # with one all-reduce per layer that answer is right
        if close(value):
            return _(hint)
    return ""


def request_seconds(fn) -> None:
    """Check ``fn(layers, device, link, n, split)`` against latency_model's model."""
    name = "request_seconds"
    for layers, device, link in _latency_cases():
        for n in (1, 2, 8):
            for split in latency_model.SPLITS:
                want = latency_model.request_seconds(layers, device, link, n, split)
                got = attempt(name, fn, layers, device, link, n, split)
                if isinstance(got, (int, float)) and abs(got - want) <= 1e-9 * want:
                    continue
                hint = (_latency_hint(got, layers, device, link, n, split)
                        if isinstance(got, (int, float))
                        else _("Return seconds, a float."))
                raise ExerciseFailed(_(
                    "{name}: {layers} layers of "
                    "{weight_bytes:.3g} B on {n} x {device} over "
                    "{link}, split={split!r}: "
                    "expected {want_ms:.6g} ms, got {got!r} s. {hint}").format(
                        name=name, layers=layers.num_layers,
                        weight_bytes=layers.weight_bytes, n=n, device=device.name,
                        link=link.name, split=split, want_ms=want * 1e3, got=got,
                        hint=hint).rstrip())
    passed(name, _("Layer-wise pays every layer plus n hops; tensor-parallel pays 1/n "
                   "of every layer plus its all-reduces."))


# ---------------------------------------------------------------- exercise 8.4


def _dp_tp_grads(state: dict, x, y) -> dict:
    """One process, the whole batch, the MLP unsplit: what DP x TP must give."""
    model = tp.MLP(x.shape[-1], state["fc1.weight"].shape[0])
    model.load_state_dict(state)
    F.mse_loss(model(x), y).backward()
    return {key: p.grad for key, p in model.named_parameters()}


def _explain_dp_tp(traceback_text: str) -> str | None:
    if "sharding strategy" in traceback_text and "allreduce" in traceback_text:
        return _("dist.all_reduce takes plain tensors, not DTensors: all-reduce "
                 "param.grad.to_local(), this rank's shard, in place.")
    return None


def _check_groups(name: str, ranks: list) -> None:
    for rank, got in enumerate(ranks):
        tp_want, dp_want = [rank // 2 * 2, rank // 2 * 2 + 1], [rank % 2, rank % 2 + 2]
        if got["tp_group"] == dp_want:
            raise ExerciseFailed(_(
                "{name}: rank {rank}'s TP group is {tp_group}: ranks on "
                "different nodes (0-1 are node 0, 2-3 node 1). TP all-reduces every "
                "layer: keep it inside a node, on NVLink. The LAST mesh dimension "
                "varies fastest, so the shape is (dp, tp) with "
                "mesh_dim_names=('dp', 'tp').").format(name=name, rank=rank,
                                                       tp_group=got["tp_group"]))
        if got["tp_group"] != tp_want or got["dp_group"] != dp_want:
            raise ExerciseFailed(_(
                "{name}: rank {rank} is in TP group {tp_group} and DP group "
                "{dp_group}, expected {tp_want} and {dp_want}: a (dp=2, tp=2) "
                "mesh, mesh_dim_names=('dp', 'tp').").format(
                    name=name, rank=rank, tp_group=got["tp_group"],
                    dp_group=got["dp_group"], tp_want=tp_want, dp_want=dp_want))


def _rows_of(batch, x) -> list | None:
    """The indices of ``x``'s rows that make up ``batch`` (None if one is not there)."""
    found = []
    for row in batch:
        hits = [i for i in range(len(x)) if torch.equal(x[i], row)]
        if not hits:
            return None
        found.append(hits[0])
    return found


def _check_batches(name: str, ranks: list, x) -> None:
    """Both TP ranks of a replica see the same samples; the replicas share the batch.

    Any split passes that gives each DP rank its own equal share of the global batch
    (blocks as x.chunk gives them, or every dp_size-th sample, ...).
    """
    for rank, got in enumerate(ranks):
        partner = ranks[rank ^ 1]["batch"]
        if not torch.equal(got["batch"], partner):
            raise ExerciseFailed(_(
                "{name}: ranks {first} and {second} (one replica, one TP group) "
                "trained on different samples: the two TP ranks of a replica must see "
                "the SAME samples (they compute one model together): split by the DP "
                "rank, mesh.get_local_rank('dp').").format(name=name, first=rank & ~1,
                                                           second=rank | 1))
    if ranks[0]["batch"].shape == x.shape:
        raise ExerciseFailed(_(
            "{name}: rank 0 trained on {samples} samples: that is the whole batch: "
            "each replica (DP rank) "
            "takes its own half, or two replicas do the same work.").format(
                name=name, samples=len(x)))
    rows = [_rows_of(ranks[r]["batch"], x) for r in (0, 2)]
    shares = [len(r) if r is not None else -1 for r in rows]
    if None in rows or sorted(rows[0] + rows[1]) != list(range(len(x))):
        raise ExerciseFailed(_(
            "{name}: the two replicas' batches ({first} and {second} samples) "
            "are not a split of the {samples} samples of the global batch: each "
            "sample goes to exactly one DP rank, e.g. x.chunk(dp_size)[dp_rank]."
        ).format(name=name, first=shares[0], second=shares[1], samples=len(x)))


def dp_tp(path="dp_tp.py") -> None:
    """Check the learner's 2 x 2 DP x TP step on 4 ranks against one process."""
    name = "dp_tp"
    module = load_program(path)
    torch.manual_seed(0)
    state = tp.MLP(8, 32).state_dict()
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(8, 8, generator=generator)
    y = torch.randn(8, 8, generator=generator)
    ranks = launch_program(
        name, run_learner, 4, args=(module.__name__, state, x, y, 2),
        module=module.__name__, explain=_explain_dp_tp, timeout=60,
        hang_hint=_("Do all four ranks call the same collectives on the same groups?"))
    _check_groups(name, ranks)
    _check_batches(name, ranks, x)
    want = _dp_tp_grads(state, x, y)
    for rank, got in enumerate(ranks):
        gap = first_difference(want, got["grads"], TOLERANCE)
        if gap is None:
            continue
        own = _dp_tp_grads(state, *(t.chunk(2)[rank // 2] for t in (x, y)))
        hint = _("Average over the DP group: all_reduce each local gradient with "
                 "group=mesh.get_group('dp') (the ranks holding the same shard), then "
                 "divide by the DP size.")
        if first_difference({k: 2 * v for k, v in want.items()}, got["grads"],
                            TOLERANCE) is None:
            hint = _("That is the SUM over the 2 replicas: divide by the DP size.")
        elif first_difference(own, got["grads"], TOLERANCE) is None:
            hint = _("That is this replica's own half-batch gradient: it was never "
                     "averaged with the other replica's. {hint}").format(hint=hint)
        raise ExerciseFailed(_("{name}: rank {rank}'s gradient of {param} differs from "
                               "one process on the whole batch by {gap:.3g}. {hint}"
                               ).format(name=name, rank=rank, param=gap[0], gap=gap[1],
                                        hint=hint))
    passed(name, _("2 replicas x 2-way TP = one process on the whole batch, to "
                   "{tolerance:g}; TP pairs [0, 1] [2, 3] inside a node, DP pairs "
                   "[0, 2] [1, 3] across nodes.").format(tolerance=TOLERANCE))
