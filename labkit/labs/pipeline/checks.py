"""Checks for lab 05 (pipeline parallelism): GPipe's schedule table, the GPipe step the
learner writes on ranks, and the 1F1B order of one stage, run on ranks.

The program checks launch the learner's module on 2 gloo ranks through
``stages.run_program`` inside ``p2p.bounded`` (a stuck message is named, not waited
for). ``timeline.Watch`` records, in each rank, the order in which its stage ran the
forwards and backwards of the micro-batches; the checks compare that order with the
reference schedule (``pipeline.orders``) where the order is the exercise (1F1B), and
otherwise use it only to explain wrong gradients. The messages each rank posted are
replayed as NCCL would run them (``nccl_order``): an order that passes on gloo but
would hang on NCCL passes, with that said (gloo cannot show the hang by running).
"""

import re
from dataclasses import replace

from labkit import nccl_order, pipeline, stages, timeline
from labkit.checks._core import ExerciseFailed, attempt, expect_close, passed
from labkit.checks._reference import use_reference
from labkit.checks._solved import has_passed, solved
from labkit.checks._programs import launch_program, load_program
from labkit.checks._split import (BOUND_S, CONFIG, NOT_CHECKED, TOLERANCE,
                                  explain_messages, first_gap)
from labkit.messages import _

__all__ = ["use_reference", "solved", "has_passed",
           "gpipe_table", "gpipe_step", "one_f_one_b"]

ORDER_CASES = [(2, 4), (4, 8), (4, 4), (3, 5), (4, 2), (2, 1)]   # (p, m), m < p too


# ---------------------------------------------------------------- exercise 5.1


def _table(got):
    """Rows as lists of "F3"/"B3"/None (idle may also be "" or "."), else as given."""
    try:
        return [[None if a is None or str(a) in ("", ".") else str(a) for a in row]
                for row in got]
    except TypeError:
        return got


def gpipe_table(fn) -> None:
    """Check ``fn(p, m)`` builds GPipe's rank x step table of "F3"/"B3"/None."""
    name = "gpipe_table"
    for p, m in [(2, 2), (3, 4), (4, 8)]:
        want = [[None if a is None else str(a) for a in row]
                for row in pipeline.schedule("gpipe", p, m)]
        got = _table(attempt(name, fn, p, m))
        if got != want:
            hint = _("{p} rows (ranks) of {steps} steps each: rank r does F0 at step "
                     "r, and B0 of the last rank follows F{last}. Expected:\n{table}"
                     ).format(p=p, steps=2 * (m + p - 1), last=m - 1,
                              table=timeline.as_text(pipeline.schedule("gpipe", p, m)))
            raise ExerciseFailed(_("{name}: wrong table for p={p}, m={m}: {hint}"
                                   ).format(name=name, p=p, m=m, hint=hint))
    passed(name, _("Count the dots: 2(p-1) idle steps on every rank."))


# ---------------------------------------------------------------- shared


def _reference_orders(name: str, p: int, m: int) -> list[list[tuple]]:
    return [[(a.kind, a.microbatch) for a in row]
            for row in pipeline.orders(name, p, m)]


def _text(order: list) -> str:
    return " ".join(f"{kind}{i}" for kind, i in order)


def _check_gradients(name: str, ranks: list, cfg, run: int, what: str,
                     order_hint: str | None = None) -> None:
    """Fail naming the rank and tensor whose gradient is off the full batch's.

    ``order_hint``: what the recorded orders say about a wrong gradient (or None);
    it only explains a failure, it never causes one.
    """
    want = stages.reference(cfg)
    m = cfg.num_microbatches
    gap = first_gap(want["grads"], ranks, cfg, run)
    if gap:
        rank, tensor, size = gap
        if m > 1 and first_gap(want["grads"], ranks, cfg, run, scale=m) is None:
            hint = _("Every gradient is {m} times the full batch's: the micro-batch "
                     "losses were added up, not averaged. Divide each micro-batch's "
                     "loss by m = {m} before its backward (the mean of m means is the "
                     "batch's mean).").format(m=m)
        elif order_hint:
            hint = order_hint
        else:
            hint = _("Does the last rank pair micro-batch i's output with micro-batch "
                     "i's targets, and does each received gradient go to the out of "
                     "the same micro-batch?")
        raise ExerciseFailed(_("{name}: {what}, m={m}: rank {rank}'s gradient of "
                               "{tensor} differs from the full batch's by {gap:.2e} "
                               "(tolerance {tolerance:g}). {hint}").format(
                                   name=name, what=what, m=m, rank=rank, tensor=tensor,
                                   gap=size, tolerance=TOLERANCE, hint=hint))
    expect_close(name, ranks[-1]["runs"][run]["loss"], want["loss"],
                 _("{what}, m={m}: the loss returned by the last rank").format(
                     what=what, m=m),
                 _("Return the sum of the micro-batch losses, each divided by m."),
                 rel=1e-5)


def _on_nccl(ranks: list) -> str:
    """What the recorded messages would do on NCCL: "" if they complete, else why not.

    Never a failure: the exercise runs on gloo, where the order is correct.
    """
    stuck = nccl_order.first_hang([r["messages"] for r in ranks])
    return "\n" + nccl_order.describe(stuck) if stuck else ""


# ---------------------------------------------------------------- exercise 5.2


def _explain_gpipe(text: str) -> str | None:
    if re.search(r"rank 0 waited .* dist\.recv\(src=1\)", text):
        return _("Rank 0 waited in its backward wave for a gradient that never came: "
                 "after each backward the last rank sends x.grad back to ctx.rank - 1.")
    if re.search(r"rank 1 waited .* dist\.recv\(src=0\)", text):
        return _("Rank 1 waited for activations: in the forward wave every rank but "
                 "the last sends each micro-batch's out (detached) to ctx.rank + 1.")
    return explain_messages(text)


def _backward_orders_hint(orders: list) -> str | None:
    """Explain wrong gradients by backward waves that differ between ranks."""
    backwards = [[i for kind, i in order if kind == "B"] for order in orders]
    if len({tuple(b) for b in backwards}) <= 1:
        return None
    orders_seen = ", ".join(_("rank {rank}: {order}").format(rank=r, order=b)
                            for r, b in enumerate(backwards))
    return _("The ranks ran their backward waves in different orders ({orders}). A "
             "rank receives gradients in the order the next rank sends them, so here a "
             "gradient met another micro-batch's activations. Run the backward wave in "
             "the same micro-batch order on every rank (any order, e.g. 0, 1, ..., "
             "m-1).").format(orders=orders_seen)


def _check_fill_drain(name: str, orders: list, m: int) -> None:
    """Fail naming the rank that started a backward before its last forward.

    Called once the gradients are right: any order of micro-batches is fine, but
    GPipe (what section 3 measures) runs every forward before the first backward.
    """
    for rank, order in enumerate(orders):
        kinds = "".join(kind for kind, _microbatch in order)
        if kinds != "F" * m + "B" * m:
            raise ExerciseFailed(_(
                "{name}: m={m}: the gradients are right, but rank {rank} ran "
                "{order}: that is not GPipe's fill-drain. GPipe runs the "
                "forward wave (all m forwards) before the backward wave (all m "
                "backwards), in any micro-batch order; section 3 measures that "
                "schedule.").format(name=name, m=m, rank=rank, order=_text(order)))


def gpipe_step(path="gpipe.py", bound_s: float = BOUND_S) -> None:
    """Check the learner's GPipe step on 2 gloo ranks for m = 2 and 4 micro-batches.

    The gradients must be the full batch's; then each rank must have run all its
    forwards before its first backward (any micro-batch order). The recorded order
    only explains wrong gradients (backward waves that differ between ranks).
    """
    name = "gpipe_step"
    module = load_program(path)
    cfgs = [replace(CONFIG, num_microbatches=m) for m in (2, 4)]
    program = stages.Program(module.__name__, "gpipe_step", "microbatches",
                             bound_s=bound_s)
    ranks = launch_program(name, stages.run_program, 2, args=(program, cfgs),
                           timeout=60, explain=_explain_gpipe, module=module.__name__)
    for run, cfg in enumerate(cfgs):
        orders = [r["runs"][run]["order"] for r in ranks]
        _check_gradients(name, ranks, cfg, run, "GPipe", _backward_orders_hint(orders))
        _check_fill_drain(name, orders, cfg.num_microbatches)
    passed(name, _("m = 2 and 4: the full batch's gradients (to {tolerance:g}) on "
                   "both ranks, every forward before the first backward. {not_checked}"
                   ).format(tolerance=TOLERANCE, not_checked=_(NOT_CHECKED))
           + _on_nccl(ranks))


# ---------------------------------------------------------------- exercise 5.3


def _order_hint(got: list, want: list, rank: int, p: int, m: int) -> str:
    """Say how a 1F1B order differs from the reference, starting with the warm-up."""
    def lead(order):   # forwards before the first backward
        return next((k for k, (kind, _microbatch) in enumerate(order) if kind == "B"),
                    len(order))

    if lead(got) != lead(want):
        warmup = min(p - rank - 1, m)
        return _("1F1B's warm-up on rank {rank} of {p} is min(p - rank - 1, m) = "
                 "{warmup} forward(s), then one forward and one backward in turn, so "
                 "its first backward comes after {want_lead} forward(s); yours after "
                 "{got_lead}.").format(rank=rank, p=p, warmup=warmup,
                                       want_lead=lead(want), got_lead=lead(got))
    return _("After the warm-up: one forward, one backward in turn, then the "
             "cool-down.")


def _normalised(got) -> list | None:
    """("F", 3) pairs from pairs, longer tuples (kind, micro-batch, ...) or "F3"."""
    def one(action):
        if isinstance(action, str):
            return action[:1], int(action[1:])
        return str(action[0]), int(action[1])
    try:
        return [one(action) for action in got]
    except (TypeError, ValueError, IndexError):
        return None


def _check_orders(name: str, fn) -> list:
    """Compare ``fn`` with 1F1B for ORDER_CASES; return its orders for p=2, m=4."""
    for p, m in ORDER_CASES:
        for rank, want in enumerate(_reference_orders("1f1b", p, m)):
            got = _normalised(attempt(name, fn, rank, p, m))
            if got is None:
                raise ExerciseFailed(_("{name}: return a list of (\"F\", i) and "
                                       "(\"B\", i) pairs.").format(name=name))
            if got != want:
                raise ExerciseFailed(_(
                    "{name}: rank {rank} of {p} stages, m={m}: expected\n  "
                    "{want}\ngot\n  {got}\n{hint}").format(
                        name=name, rank=rank, p=p, m=m, want=_text(want),
                        got=_text(got), hint=_order_hint(got, want, rank, p, m)))
    return [_normalised(fn(rank, 2, 4)) for rank in range(2)]


def _explain_order(text: str) -> str | None:
    if "blocking dist.send" in text:
        return _("Two blocking sends facing each other: in 1F1B a rank sends "
                 "activations forward while the next rank sends it a gradient back, "
                 "and a blocking dist.send waits until the other side receives, so "
                 "both wait forever (deadlock). A dist.isend would pass here on gloo, "
                 "but not on NCCL, where even non-blocking sends facing each other "
                 "wait for each other: post each send with the receive that the next "
                 "action waits for in one dist.batch_isend_irecv, as the given "
                 "run_order does.")
    if "waited" in text and "dist.recv" in text:
        return _("The two ranks' orders do not fit together: one waits for a message "
                 "the other never sends. Is every micro-batch forwarded and backwarded "
                 "once on each rank?")
    return explain_messages(text)


def one_f_one_b(path="one_f_one_b.py", bound_s: float = BOUND_S) -> None:
    """Check the learner's 1F1B order, then run it on 2 gloo ranks with ``run_order``.

    The orders must equal ``pipeline.orders("1f1b", p, m)`` for ``ORDER_CASES``; on the
    ranks (m = 4), 1F1B and GPipe orders must give the full batch's gradients, and the
    micro-batches of activations held at once are measured.
    """
    name = "one_f_one_b"
    module = load_program(path)
    mine = _check_orders(name, module.one_f_one_b)
    cfg = replace(CONFIG, num_microbatches=4)
    program = stages.Program(module.__name__, "run_order", "order", bound_s=bound_s)
    ranks = launch_program(name, stages.run_program, 2,
                           args=(program, [cfg, cfg], [mine, _reference_orders(
                               "gpipe", 2, 4)]), timeout=60, explain=_explain_order,
                           module=module.__name__)
    held = {}
    for run, schedule in enumerate(("1f1b", "gpipe")):
        _check_gradients(name, ranks, cfg, run, schedule)
        held[schedule] = [r["runs"][run]["peak_held"] for r in ranks]
        want = pipeline.peak_activations(pipeline.schedule(schedule, 2, 4))
        if held[schedule] != want:
            raise ExerciseFailed(_("{name}: {schedule} on 2 ranks held {held} "
                                   "micro-batches of activations at once, not {want}: "
                                   "free each micro-batch's activations at its "
                                   "backward.").format(name=name, schedule=schedule,
                                                       held=held[schedule], want=want))
    kib = [ranks[0]["runs"][run]["peak_bytes"] / 2**10 for run in (0, 1)]
    passed(name, _("1F1B orders right for {cases} (p, m); on 2 ranks (m=4) the full "
                   "batch's gradients, holding {held_1f1b} micro-batches of "
                   "activations (rank 0: {kib_1f1b:.0f} KiB) where GPipe holds "
                   "{held_gpipe} ({kib_gpipe:.0f} KiB). {not_checked}").format(
                       cases=len(ORDER_CASES), held_1f1b=held["1f1b"], kib_1f1b=kib[0],
                       held_gpipe=held["gpipe"], kib_gpipe=kib[1],
                       not_checked=_(NOT_CHECKED)) + _on_nccl(ranks))
