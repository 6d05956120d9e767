"""Checks for lab 06 (communication): the all-reduce timing worker, a gradient
compression hook, and local SGD's parameter averaging.

Each check launches the learner's module on 2 gloo ranks through a rank-side harness
that spies on ``all_reduce`` / ``barrier`` / ``broadcast`` however the learner
imported them (``dist.all_reduce``, ``from torch.distributed import all_reduce``,
``distributed_c10d.all_reduce``). The verdicts come from what the solution computed;
the spies only name the likely mistake. No verdict depends on this machine's speed:
the timing check makes every all-reduce take a known extra time and compares what
the learner returned with the spy's own clock on the very same calls. Over the
300-line budget, like lab 03's checks: each exercise's harness sits next to its check.
"""

import importlib
import math
import statistics
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit import data, models
from labkit.labs.communication import local_sgd
from labkit.checks._core import ExerciseFailed, passed
from labkit.checks._reference import use_reference
from labkit.checks._solved import has_passed, solved
from labkit.checks._programs import first_difference, launch_program, load_program
from labkit.messages import N_, _

__all__ = ["use_reference", "solved", "has_passed",
           "allreduce_timing", "cast_hook", "local_sgd_worker",
           "HOOK_TOLERANCE",
           "spied_timing", "spied_hook", "spied_local_sgd"]

CALL_S = 0.005   # every spied all-reduce of the timing check also sleeps this long
HICCUP_S = 0.2   # and ONE timed call of the first size this much more, on every rank
# Hook vs plain DDP, per tensor: max |difference| <= tolerance x max |plain gradient|.
# fp16 keeps 11 significant bits, bf16 8: a cast, a sum and a cast back stay inside.
HOOK_TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}
LARGE_GRADIENT = 4e4   # fp16's largest value is 65504: a sum of two of these is inf
# translated where used: _(NOT_CHECKED_CUDA)
NOT_CHECKED_CUDA = N_("Not checked here: the CUDA branch (the check's ranks are gloo CPU "
                      "processes)")


@contextmanager
def _spy(events: list, hiccup=None, modules=()):
    """Record every all_reduce (bytes, start, end, dtype), barrier and broadcast.

    The spies replace the functions in ``torch.distributed``, in
    ``distributed_c10d`` and wherever ``modules`` (the learner's) bound them by
    name, so any spelling of the call is seen. ``hiccup(n_bytes, index)`` may return
    seconds to sleep before that call (counted in its span).
    """
    originals = {"all_reduce": dist.all_reduce, "barrier": dist.barrier,
                 "monitored_barrier": dist.monitored_barrier,
                 "broadcast": dist.broadcast}

    def spied_all_reduce(tensor, *args, **kwargs):
        n_bytes = tensor.numel() * tensor.element_size()
        index = sum(1 for e in events if e[0] == "all_reduce" and e[1] == n_bytes)
        start = time.perf_counter()
        if hiccup is not None:
            time.sleep(hiccup(n_bytes, index))
        work = originals["all_reduce"](tensor, *args, **kwargs)
        events.append(("all_reduce", n_bytes, start, time.perf_counter(),
                       str(tensor.dtype).removeprefix("torch.")))
        return work

    def barrier_spy(name):
        def spied_barrier(*args, **kwargs):
            events.append(("barrier", 0, time.perf_counter(), 0.0, ""))
            return originals[name](*args, **kwargs)
        return spied_barrier

    def spied_broadcast(tensor, *args, **kwargs):
        events.append(("broadcast", tensor.numel() * tensor.element_size(), 0.0, 0.0,
                       ""))
        return originals["broadcast"](tensor, *args, **kwargs)

    spies = {"all_reduce": spied_all_reduce, "barrier": barrier_spy("barrier"),
             "monitored_barrier": barrier_spy("monitored_barrier"),
             "broadcast": spied_broadcast}
    by_id = {id(fn): spies[name] for name, fn in originals.items()}
    patched = []
    for namespace in (dist, c10d, *modules):
        for attr, value in list(vars(namespace).items()):
            if id(value) in by_id and callable(value):
                patched.append((namespace, attr, value))
                setattr(namespace, attr, by_id[id(value)])
    try:
        yield
    finally:
        for namespace, attr, value in reversed(patched):
            setattr(namespace, attr, value)


# ---------------------------------------------------------------- exercise 6.1


def spied_timing(ctx, module: str, sizes, iters: int, warmup: int) -> dict:
    """Rank worker: run the learner's ``time_allreduce`` with the spies in place.

    Every all-reduce sleeps ``CALL_S`` first (a known cost far above this machine's
    scheduling noise), and the last call of the first size ``HICCUP_S`` more, on
    every rank: a hiccup that a median ignores and a batched mean spreads over the
    calls. The spy's clock times each call, so the check compares the learner's
    answer with the durations of the same calls, whatever the machine's load.
    """
    events: list = []
    first: list = []

    def hiccup(n_bytes, index):
        if not first:
            first.append(n_bytes)   # the first size the learner all-reduces
        last = index == warmup + iters - 1
        return CALL_S + (HICCUP_S if n_bytes == first[0] and last else 0.0)

    learner = importlib.import_module(module)
    with _spy(events, hiccup, modules=(learner,)):
        times = learner.time_allreduce(ctx, list(sizes), iters, warmup)
    return {"times": times, "events": events}


def _timing_hint_sizes(name, times, calls: dict, sizes) -> None:
    """Fail unless every size came back, and the tensors had those sizes."""
    if not isinstance(times, dict) or sorted(times) != sorted(sizes):
        got = sorted(times) if isinstance(times, dict) else type(times).__name__
        raise ExerciseFailed(_("{name}: return {{n_bytes: seconds}} with one entry per "
                               "size in `sizes` ({sizes}); got {got}.").format(
                                   name=name, sizes=list(sizes), got=got))
    bad = [v for v in times.values() if not isinstance(v, (int, float)) or v <= 0]
    if bad:
        raise ExerciseFailed(_("{name}: every time must be a positive number of "
                               "seconds (a float), got {value!r}.").format(name=name,
                                                                          value=bad[0]))
    if sorted(calls) != sorted(sizes):
        quadruple = sorted(calls) == sorted(4 * n for n in sizes)
        hint = (_("Sizes are in bytes and a float32 holds 4: make the tensor "
                  "torch.ones(n_bytes // 4).") if quadruple else
                _("Make one float32 tensor of n_bytes // 4 elements per size."))
        raise ExerciseFailed(_(
            "{name}: the tensors you all-reduced held {held} bytes, the sizes asked "
            "for were {sizes} bytes. {hint}").format(name=name, held=sorted(calls),
                                                     sizes=list(sizes), hint=hint))


def _timing_hint_calls(name, calls: dict, barriers: list, iters, warmup) -> None:
    """Fail unless each size had warm-up + timed calls and a barrier in between."""
    for n_bytes, starts in sorted(calls.items()):
        if len(starts) == iters:
            raise ExerciseFailed(_(
                "{name}: {n_bytes} B was all-reduced {iters} times, all timed: warm "
                "up first ({warmup} untimed calls). The first calls pay for "
                "connections and buffers (on GPUs, NCCL's set-up) and are not the "
                "steady state nccl-tests reports.").format(
                    name=name, n_bytes=n_bytes, iters=iters, warmup=warmup))
        if len(starts) != iters + warmup:
            raise ExerciseFailed(_(
                "{name}: {n_bytes} B was all-reduced {calls} times; expected "
                "{warmup} warm-up + {iters} timed = {total} calls per size.").format(
                    name=name, n_bytes=n_bytes, calls=len(starts), warmup=warmup,
                    iters=iters, total=warmup + iters))
        if not any(starts[warmup - 1] < t < starts[warmup] for t in barriers):
            where = ("" if not any(t < starts[0] for t in barriers) else
                     _(" (yours comes before the warm-up: after it, the ranks can be "
                       "out of step again)"))
            raise ExerciseFailed(_(
                "{name}: no dist.barrier() between the warm-up and the timed calls of "
                "{n_bytes} B{where}. Without it one rank starts its clock while the "
                "other is still busy, and the first timed call includes that wait."
            ).format(name=name, n_bytes=n_bytes, where=where))


def _spans(spans: list, ends: list, iters: int) -> dict:
    """The spy's own figures for the timed calls of one size (seconds)."""
    timed = spans[-iters:]
    block = ends[-1] - (ends[-iters] - spans[-iters])   # first start to last end
    return {"median": statistics.median(timed), "mean": statistics.fmean(timed),
            "batched": block / iters, "max": max(timed)}


def _timing_hint_values(name, times, measured: dict, iters) -> None:
    """Compare each returned time with the spy's durations of the same timed calls.

    Accepted: anything from half the calls' median to twice their batched mean (the
    per-call median and nccl-tests' mean of a block both land there). Every call
    took at least ``CALL_S`` on purpose, so the bands are far apart.
    """
    for n_bytes, seconds in sorted(times.items()):
        m = measured[n_bytes]
        high = 2 * max(m["mean"], m["batched"])
        ratio = seconds / m["median"]
        if seconds <= high and seconds >= 0.5 * m["median"]:
            continue
        if 200 < ratio < 5000:
            raise ExerciseFailed(_("{name}: {n_bytes} B took {per_call_ms:.3f} ms "
                                   "per call but you returned {seconds!r}: return "
                                   "seconds, not milliseconds.").format(
                                       name=name, n_bytes=n_bytes,
                                       per_call_ms=m["median"] * 1e3, seconds=seconds))
        # Too long: the nearer (by ratio) of the calls' total and their slowest one.
        total = iters * m["mean"]
        nearest = min((abs(math.log(seconds / total)), "total"),
                      (abs(math.log(seconds / m["max"])), "max"))
        if seconds > high and nearest[1] == "total" and nearest[0] < math.log(2):
            raise ExerciseFailed(_(
                "{name}: for {n_bytes} B you returned {returned_ms:.3f} ms, about "
                "{calls:.0f} calls' worth ({per_call_ms:.3f} ms "
                "each): divide the block's time by the number of calls (nccl-tests' "
                "mean) or return the median of the per-call times, not the total."
            ).format(name=name, n_bytes=n_bytes, returned_ms=seconds * 1e3,
                     calls=seconds / m["mean"], per_call_ms=m["mean"] * 1e3))
        if seconds > high and nearest[1] == "max" and nearest[0] < math.log(1.25):
            raise ExerciseFailed(_(
                "{name}: the check made ONE of the {iters} timed calls of {n_bytes} B "
                "{hiccup_ms:.0f} ms slow (a hiccup: another process, a page "
                "fault). You returned {returned_ms:.1f} ms: the slowest call (the "
                "max). Return the median of the per-call times (it ignores the "
                "hiccup) or the mean of a block of calls (nccl-tests: it spreads it)."
            ).format(name=name, iters=iters, n_bytes=n_bytes, hiccup_ms=HICCUP_S * 1e3,
                     returned_ms=seconds * 1e3))
        if seconds > high:
            raise ExerciseFailed(_(
                "{name}: for {n_bytes} B you returned {returned_ms:.3f} ms, "
                "{ratio:.1f}x what one call took "
                "({per_call_ms:.3f} ms on average, timed by the check): time "
                "only the timed all-reduces, and divide by their number.").format(
                    name=name, n_bytes=n_bytes, returned_ms=seconds * 1e3,
                    ratio=seconds / m["mean"], per_call_ms=m["mean"] * 1e3))
        raise ExerciseFailed(_(
            "{name}: for {n_bytes} B you returned {returned_us:.1f} us, less "
            "than one call takes ({per_call_us:.1f} us): stop the clock after "
            "dist.all_reduce returns (on GPUs, after torch.cuda.synchronize())."
        ).format(name=name, n_bytes=n_bytes, returned_us=seconds * 1e6,
                 per_call_us=m["median"] * 1e6))


def _which_statistic(times, measured: dict, hiccup_size: int) -> str:
    """Name what the learner returned for the size with the hiccup."""
    m, seconds = measured[hiccup_size], times[hiccup_size]
    if seconds < math.sqrt(m["median"] * m["mean"]):
        return _("a per-call median ({returned_ms:.1f} ms for {n_bytes} B: the "
                 "{hiccup_ms:.0f} ms hiccup ignored)").format(
                     returned_ms=seconds * 1e3, n_bytes=hiccup_size,
                     hiccup_ms=HICCUP_S * 1e3)
    return _("a mean over the calls, as nccl-tests reports ({returned_ms:.1f} ms for "
             "{n_bytes} B: the {hiccup_ms:.0f} ms hiccup spread over the "
             "calls)").format(returned_ms=seconds * 1e3, n_bytes=hiccup_size,
                              hiccup_ms=HICCUP_S * 1e3)


def allreduce_timing(path="allreduce_timing.py", sizes=(4, 1024, 65536, 2**20),
                     iters: int = 10, warmup: int = 3) -> None:
    """Check the learner's ``time_allreduce(ctx, sizes, iters, warmup)`` on 2 ranks."""
    name = "time_allreduce"
    module = load_program(path)
    ranks = launch_program(
        name, spied_timing, 2, args=(module.__name__, tuple(sizes), iters, warmup),
        module=module.__name__, timeout=60,
        hang_hint=_("Does every rank call the same all-reduces and barriers (no `if "
                    "ctx.rank == 0:` around a collective)?"))
    said = []
    for rank, result in enumerate(ranks):
        events = result["events"]
        calls, spans, ends = {}, {}, {}
        for kind, n_bytes, start, end, _dtype in events:
            if kind == "all_reduce":
                calls.setdefault(n_bytes, []).append(start)
                spans.setdefault(n_bytes, []).append(end - start)
                ends.setdefault(n_bytes, []).append(end)
        barriers = [start for kind, _size, start, *_rest in events if kind == "barrier"]
        try:
            _timing_hint_sizes(name, result["times"], calls, sizes)
            _timing_hint_calls(name, calls, barriers, iters, warmup)
            measured = {n: _spans(spans[n], ends[n], iters) for n in calls}
            _timing_hint_values(name, result["times"], measured, iters)
        except ExerciseFailed as err:
            raise ExerciseFailed(_("rank {rank}: {error}").format(rank=rank, error=err)
                                 ) from None
        hiccup_size = min(calls, key=lambda n: calls[n][0])   # the first size timed
        said.append(_which_statistic(result["times"], measured, hiccup_size))
    passed(name, _("warm-up, barrier and {iters} timed calls for {sizes} sizes on "
                   "both ranks; rank 0 returned {statistic}. Both a per-call median and "
                   "a batched mean are right. {not_checked}: synchronize before "
                   "you read the clock.").format(iters=iters, sizes=len(sizes),
                                                 statistic=said[0],
                                                 not_checked=_(NOT_CHECKED_CUDA)))


# ---------------------------------------------------------------- exercise 6.2


class _CheckStop(RuntimeError):
    """Raised inside a rank when the learner's hook broke DDP's contract."""


def _wrap_hook(learner_hook, facts: dict):
    """Call the learner's hook; note what its future holds; keep DDP going."""
    def hook(state, bucket):
        fut = learner_hook(state, bucket)
        if not isinstance(fut, torch._C.Future):   # what get_future() returns
            raise _CheckStop(_("labkit check: the hook returned {type}, not a "
                               "torch.futures.Future").format(type=type(fut).__name__))

        def look(done):
            value = done.value()
            if isinstance(value, (list, tuple)):
                facts["value"] = "list"
                value = value[0]   # what DDP cannot take: note it, carry on
            else:
                facts["value"] = str(value.dtype).removeprefix("torch.")
            return value
        return fut.then(look)
    return hook


def _grads(model, images, labels, scale: float) -> dict:
    model.zero_grad(set_to_none=True)
    (F.cross_entropy(model(images), labels) * scale).backward()
    return {n: p.grad.detach().clone() for n, p in model.module.named_parameters()}


def _hook_case(ctx, learner, dtype: str, large: bool) -> dict:
    """One step of plain DDP and of DDP with the learner's hook, same model and data.

    ``large``: the same batch on both ranks, the loss scaled so that the largest
    gradient is ``LARGE_GRADIENT``: summing before dividing overflows fp16.
    """
    images, labels = data.random_batch(16, 0 if large else ctx.rank + 1)
    torch.manual_seed(0)
    plain = DDP(models.deep_mlp(num_layers=3, width=64))
    scale = 1.0
    if large:
        scale = LARGE_GRADIENT / max(g.abs().max().item() for g in
                                     _grads(plain, images, labels, 1.0).values())
    want = _grads(plain, images, labels, scale)
    torch.manual_seed(0)
    hooked = DDP(models.deep_mlp(num_layers=3, width=64))
    facts: dict = {}
    hooked.register_comm_hook(getattr(torch, dtype),
                              _wrap_hook(learner.cast_hook, facts))
    events: list = []
    with _spy(events, modules=(learner,)):
        got = _grads(hooked, images, labels, scale)
    facts["sent"] = sorted({e[4] for e in events if e[0] == "all_reduce"})
    return {"want": want, "got": got, "facts": facts}


def spied_hook(ctx, module: str, cases) -> list:
    """Rank worker: run every (dtype, large) case with the learner's ``cast_hook``."""
    learner = importlib.import_module(module)
    return [_hook_case(ctx, learner, dtype, large) for dtype, large in cases]


def _explain_hook_crash(text: str) -> str | None:
    if "_CheckStop" in text or "not a torch.futures.Future" in text:   # any language
        return _("A DDP hook must return a Future: `return fut.then(decompress)`, where "
                 "fut = dist.all_reduce(compressed, async_op=True).get_future(). "
                 "(Returning None crashes the rank; returning a tensor raises "
                 "'must return a torch.futures.Future object'.)")
    return None


def _hook_contract(name, dtype, results) -> None:
    """Fail if a hook broke the contract: one tensor, the bucket dtype, compressed."""
    for rank, r in enumerate(results):
        facts = r["facts"]
        where = _("{name} ({dtype}, rank {rank})").format(name=name, dtype=dtype,
                                                          rank=rank)
        if facts.get("value") == "list":
            raise ExerciseFailed(_(
                "{where}: your future holds a list: that is the future of the "
                "all-reduce work itself (its value is [tensor]). DDP wants one tensor: "
                "chain .then(decompress) and return the tensor from there. Unchecked, "
                "DDP fails with 'INTERNAL ASSERT FAILED ... expected the hook result "
                "is a PyObject'.").format(where=where))
        if facts.get("value") != "float32":
            raise ExerciseFailed(_(
                "{where}: your future holds a {dtype} tensor. Cast back "
                "to the bucket's dtype: copy the result into bucket.buffer() (copy_ "
                "casts) and return the buffer. DDP happens to cast when it copies "
                "into .grad, but the hook's contract is the bucket's new value, and "
                "decompressing in place is what keeps the memory peak down.").format(
                    where=where, dtype=facts.get("value")))
        sent = facts["sent"]
        exact = max((r["got"][k].double() - w.double()).abs().max().item()
                    / max(w.abs().max().item(), 1e-30) for k, w in r["want"].items())
        if (sent and dtype not in sent) or (not sent and exact < 1e-6):
            raise ExerciseFailed(_(
                "{where}: your all-reduce sent {sent}, not "
                "{dtype}: all-reduce the compressed copy (buffer.to(dtype)), or "
                "nothing is saved.").format(
                    where=where, sent=sent or _("float32 (no rounding)"), dtype=dtype))


def _hook_values(name, dtype, large, results) -> None:
    """Fail unless the hook's gradients are plain DDP's average, to the tolerance."""
    got0, got1 = results[0]["got"], results[1]["got"]
    if first_difference(got0, got1, 0.0) is not None:
        raise ExerciseFailed(_(
            "{name} ({dtype}): the two ranks ended with different gradients: you "
            "returned this rank's own buffer instead of the averaged values. Copy the "
            "all-reduced tensor into bucket.buffer() before returning it.").format(
                name=name, dtype=dtype))
    want = results[0]["want"]
    if large and not all(torch.isfinite(g).all() for g in got0.values()):
        raise ExerciseFailed(_(
            "{name} (float16, gradients near {largest:g}): inf or nan came "
            "back. float16 stops at 65504: divide by the world size BEFORE the "
            "all-reduce, so the sum stays in range (that is what the built-in "
            "fp16_compress_hook does).").format(name=name, largest=LARGE_GRADIENT))
    ratio = sum(g.abs().sum() for g in got0.values()) / sum(
        g.abs().sum() for g in want.values())
    if abs(ratio - 2.0) < 0.1:
        raise ExerciseFailed(_(
            "{name} ({dtype}): your gradients are {ratio:.2f}x plain DDP's: "
            "all_reduce sums, and the hook must average: divide by "
            "dist.get_world_size() (before the all-reduce, in the compressed copy)."
        ).format(name=name, dtype=dtype, ratio=ratio))
    tolerance = HOOK_TOLERANCE[dtype]
    for key, g in want.items():
        gap = (got0[key].double() - g.double()).abs().max().item()
        if gap > tolerance * g.abs().max().item():
            raise ExerciseFailed(_(
                "{name} ({dtype}): {tensor} differs from plain DDP by {gap:.2e}, more "
                "than {tolerance:g} x its largest gradient. Divide by the world size, "
                "cast to {dtype}, all-reduce, cast back.").format(
                    name=name, dtype=dtype, tensor=key, gap=gap, tolerance=tolerance))


def cast_hook(path="cast_hook.py") -> None:
    """Check the learner's ``cast_hook(dtype, bucket)`` against plain DDP on 2 ranks."""
    name = "cast_hook"
    module = load_program(path)
    cases = (("float16", False), ("bfloat16", False), ("float16", True))
    ranks = launch_program(name, spied_hook, 2, args=(module.__name__, cases),
                           module=module.__name__, timeout=60,
                           explain=_explain_hook_crash,
                           hang_hint=_("Does the hook call dist.all_reduce on every "
                                       "rank, once per bucket?"))
    for i, (dtype, large) in enumerate(cases):
        results = [rank[i] for rank in ranks]
        _hook_contract(name, dtype, results)
        _hook_values(name, dtype, large, results)
    passed(name, _("within {tolerances} of plain DDP on both ranks, half the bytes, "
                   "and no fp16 overflow near {largest:g}. Not checked here: NCCL and "
                   "CUDA buckets (the check's ranks are gloo CPU processes).").format(
                       tolerances=", ".join(f"{t:g} ({d})"
                                            for d, t in HOOK_TOLERANCE.items()),
                       largest=LARGE_GRADIENT))


# ---------------------------------------------------------------- exercise 6.3


def spied_local_sgd(ctx, module: str, configs) -> list:
    """Rank worker: for each config, labkit's local SGD, then the learner's, spied."""
    return [_local_sgd_case(ctx, module, cfg) for cfg in configs]


def _local_sgd_case(ctx, module: str, cfg) -> dict:
    reference = local_sgd.train(ctx, cfg)
    learner = importlib.import_module(module)
    events: list = []
    with _spy(events, modules=(learner,)):
        out = learner.train(ctx, cfg)
    return {"reference": reference["state"], "state": out["state"],
            "rounds": out["rounds"],
            "bytes": sum(e[1] for e in events if e[0] == "all_reduce"),
            "broadcasts": sum(1 for e in events if e[0] == "broadcast"),
            "param_bytes": sum(t.numel() * t.element_size()
                               for t in reference["state"].values())}


_ROUNDS_HINT = N_("{case}: train returned rounds={got}, expected {rounds}: count each "
                  "averaging round.")   # translated where used


def _local_sgd_hint(name, cfg, ranks) -> None:
    """Pass when the parameters equal labkit's local SGD on both ranks and the
    rounds are counted; otherwise let the spied bytes name the likely mistake."""
    rounds = cfg.steps // cfg.period
    r = ranks[0]
    case = _("{name} (steps={steps}, period={period})").format(
        name=name, steps=cfg.steps, period=cfg.period)
    right = (first_difference(ranks[0]["state"], ranks[1]["state"], 1e-6) is None
             and first_difference(r["reference"], r["state"], 1e-5) is None)
    if right and r["rounds"] == rounds:
        return
    if right:
        raise ExerciseFailed(_(_ROUNDS_HINT).format(case=case, got=r["rounds"],
                                                 rounds=rounds))
    if r["bytes"] == 0:
        raise ExerciseFailed(
            _("{case}: no parameter was all-reduced: dist.broadcast copies rank 0's "
              "weights, local SGD AVERAGES them (all_reduce, then divide by the world "
              "size).").format(case=case) if r["broadcasts"] else
            _("{case}: no parameter was all-reduced: call average_parameters(model) "
              "every `period` steps.").format(case=case))
    if r["bytes"] == cfg.steps * r["param_bytes"]:
        raise ExerciseFailed(_("{case}: you averaged after every step: only when "
                               "(step + 1) % cfg.period == 0, or nothing is saved."
                               ).format(case=case))
    if r["bytes"] != rounds * r["param_bytes"]:
        raise ExerciseFailed(_(
            "{case}: {sent:,} bytes all-reduced, expected {rounds} rounds x "
            "{param_bytes:,} bytes of parameters (each parameter once per "
            "round).").format(case=case, sent=r["bytes"], rounds=rounds,
                              param_bytes=r["param_bytes"]))
    if r["rounds"] != rounds:
        raise ExerciseFailed(_(_ROUNDS_HINT).format(case=case, got=r["rounds"],
                                                 rounds=rounds))
    if first_difference(ranks[0]["state"], ranks[1]["state"], 1e-6) is not None:
        raise ExerciseFailed(_(
            "{case}: after the last step the ranks' parameters differ: average the "
            "parameters themselves (not .grad), right AFTER optimizer.step(), when "
            "(step + 1) % cfg.period == 0, so the run ends averaged.").format(
                case=case))
    state, want = r["state"], r["reference"]
    big = max(v.abs().max().item() for v in state.values())
    if not math.isfinite(big) or big > 4 * max(v.abs().max().item()
                                               for v in want.values()):
        raise ExerciseFailed(_("{case}: the parameters grew to {largest:.3g}: "
                               "all_reduce SUMS them; divide by dist.get_world_size() "
                               "for the mean.").format(case=case, largest=big))
    gap = first_difference(want, state, 1e-5)
    if gap is not None:
        raise ExerciseFailed(_(
            "{case}: {tensor} differs from labkit's local SGD by {gap:.2e}: each "
            "round, replace every parameter by its mean over the ranks.").format(
                case=case, tensor=gap[0], gap=gap[1]))


def local_sgd_worker(path="local_sgd.py") -> None:
    """Check the learner's local SGD ``train`` (average every ``period`` steps)."""
    name = "local_sgd"
    module = load_program(path)
    configs = [local_sgd.Config(steps=12, period=period, limit=1024)
               for period in (4, 3)]
    ranks = launch_program(name, spied_local_sgd, 2, args=(module.__name__, configs),
                           module=module.__name__, timeout=60,
                           hang_hint=_("Do both ranks average on the same steps?"))
    for i, cfg in enumerate(configs):
        _local_sgd_hint(name, cfg, [rank[i] for rank in ranks])
    passed(name, _("averaged every `period` steps, equal to labkit's local SGD to "
                   "1e-5 on both ranks, and the rounds counted. Not checked here: the "
                   "model on a CUDA device (the check's ranks are gloo CPU processes)."))
