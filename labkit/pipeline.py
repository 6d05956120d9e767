"""Pipeline schedules as data, their bubble in theory and measured, and input checks.

Taught in: lab 05 (流水线并行 pipeline parallelism: GPipe, 1F1B, interleaved 1F1B).
A schedule is each rank's ordered list of actions (``F3``: forward of micro-batch 3,
``B3``: its backward); ``schedule`` places them on unit time steps, respecting the
data dependencies, and returns a rank x step table with ``None`` where a rank idles.
The executors (``pipeline_run`` here, the learner's programs on ranks) walk the same
per-rank orders.
"""

import warnings
from typing import NamedTuple

from labkit.messages import _

__all__ = ["Action", "SCHEDULES", "orders", "schedule", "bubble_theory",
           "bubble_overhead", "bubble_fraction", "peak_activations",
           "check_microbatches", "split_microbatches"]


class Action(NamedTuple):
    """One unit of pipeline work: kind "F"/"B", micro-batch index, (virtual) stage."""

    kind: str
    microbatch: int
    stage: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


def _gpipe(num_stages: int, num_microbatches: int, rank: int, num_chunks: int):
    """GPipe (fill-drain): every forward, then every backward."""
    m = num_microbatches
    return ([Action("F", i, rank) for i in range(m)] +
            [Action("B", i, rank) for i in range(m)])


def _one_f_one_b(num_stages: int, num_microbatches: int, rank: int, num_chunks: int):
    """1F1B: a few forwards to fill, then one forward and one backward in turn."""
    m = num_microbatches
    warmup = min(num_stages - rank - 1, m)   # later stages start their backwards sooner
    order = [Action("F", i, rank) for i in range(warmup)]   # warmup
    for i in range(m - warmup):                             # steady state
        order += [Action("F", warmup + i, rank), Action("B", i, rank)]
    order += [Action("B", i, rank) for i in range(m - warmup, m)]   # cooldown
    return order


def _interleaved(num_stages: int, num_microbatches: int, rank: int, num_chunks: int):
    """Interleaved 1F1B (Megatron-LM): rank r holds chunks r, r+p, ...; groups of p."""
    p, m, v = num_stages, num_microbatches, num_chunks
    if m % p:
        raise ValueError(_(
            "interleaved_1f1b needs num_microbatches ({num_microbatches}) to be a "
            "multiple of num_stages ({num_stages}): micro-batches go in groups of p."
        ).format(num_microbatches=m, num_stages=p))

    def action(kind: str, k: int) -> Action:
        chunk = (k // p) % v
        chunk = v - 1 - chunk if kind == "B" else chunk   # backwards: chunks reversed
        return Action(kind, (k // (p * v)) * p + k % p, chunk * p + rank)

    total = m * v
    warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
    order = [action("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [action("F", warmup + k), action("B", k)]
    return order + [action("B", k) for k in range(total - warmup, total)]


SCHEDULES = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved_1f1b": _interleaved}


def _check_counts(num_stages, num_microbatches, num_chunks) -> None:
    for label, value in [("num_stages", num_stages), ("num_chunks", num_chunks),
                         ("num_microbatches", num_microbatches)]:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(_("{name} must be a positive integer, got {value!r}."
                               ).format(name=label, value=value))


def orders(name: str, num_stages: int, num_microbatches: int,
           num_chunks: int = 1) -> list[list[Action]]:
    """Return each rank's ordered actions for schedule ``name`` (see ``SCHEDULES``)."""
    if name not in SCHEDULES:
        raise ValueError(_("Unknown schedule {name!r}: choose one of {choices}."
                           ).format(name=name, choices=", ".join(SCHEDULES)))
    _check_counts(num_stages, num_microbatches, num_chunks)
    if num_chunks > 1 and name != "interleaved_1f1b":
        raise ValueError(_("{name} runs one chunk per rank; num_chunks={num_chunks} "
                           "needs schedule 'interleaved_1f1b'.").format(
                               name=name, num_chunks=num_chunks))
    build = SCHEDULES[name]
    return [build(num_stages, num_microbatches, rank, num_chunks)
            for rank in range(num_stages)]


def _ready(action: Action, done: set, last_stage: int) -> bool:
    """Tell whether the inputs of ``action`` were produced in an earlier step."""
    kind, mb, stage = action
    if kind == "F":
        return stage == 0 or ("F", mb, stage - 1) in done
    needs_grad = stage == last_stage or ("B", mb, stage + 1) in done
    return needs_grad and ("F", mb, stage) in done


def _simulate(rank_orders: list[list[Action]], last_stage: int) -> list[list]:
    """Place each rank's actions on unit time steps, as early as dependencies allow."""
    table: list[list] = [[] for _order in rank_orders]
    position, done = [0] * len(rank_orders), set()
    while any(pos < len(o) for pos, o in zip(position, rank_orders)):
        finished = []
        for rank, order in enumerate(rank_orders):
            action = order[position[rank]] if position[rank] < len(order) else None
            if action is not None and _ready(action, done, last_stage):
                position[rank] += 1
                finished.append(action)
            table[rank].append(action if action in finished else None)
        if not finished:
            waiting = [str(o[p]) for p, o in zip(position, rank_orders) if p < len(o)]
            raise RuntimeError(_("Schedule deadlocks at step {step}: every rank waits "
                                 "({waiting}); check the orders.").format(
                                     step=len(table[0]) - 1,
                                     waiting=", ".join(waiting)))
        done.update(finished)
    return table


def schedule(name: str, num_stages: int, num_microbatches: int,
             num_chunks: int = 1) -> list[list]:
    """Return the rank x step table of ``Action`` (None = idle) for schedule ``name``.

    One step is one stage's forward or backward on one micro-batch (equal costs, no
    communication time): the picture every pipeline paper draws.
    """
    rank_orders = orders(name, num_stages, num_microbatches, num_chunks)
    return _simulate(rank_orders, last_stage=num_stages * num_chunks - 1)


def bubble_theory(num_stages: int, num_microbatches: int, num_chunks: int = 1) -> float:
    """Return the idle fraction of total time: (p-1)/(v*m + p-1); v=1 for GPipe/1F1B."""
    _check_counts(num_stages, num_microbatches, num_chunks)
    p, m, v = num_stages, num_microbatches, num_chunks
    return (p - 1) / (v * m + p - 1)


def bubble_overhead(num_stages: int, num_microbatches: int,
                    num_chunks: int = 1) -> float:
    """Return the bubble over the ideal (bubble-free) time: (1/v)(p-1)/m."""
    _check_counts(num_stages, num_microbatches, num_chunks)
    return (num_stages - 1) / (num_chunks * num_microbatches)


def bubble_fraction(timeline) -> float:
    """Return the idle fraction of a timeline: a schedule table or a list of events.

    Events need ``row``, ``start`` and ``end``; idle is everything in
    [first start, last end] on each row that no event covers.
    """
    if timeline and isinstance(timeline[0], list):   # a rank x step table
        slots = [slot for row in timeline for slot in row]
        return sum(slot is None for slot in slots) / len(slots)
    if not timeline:
        raise ValueError(_("bubble_fraction needs at least one event or table row."))
    rows = {e.row for e in timeline}
    span = max(e.end for e in timeline) - min(e.start for e in timeline)
    busy = sum(e.end - e.start for e in timeline)
    return 1.0 - busy / (len(rows) * span)


def peak_activations(table: list[list]) -> list[int]:
    """Return, per rank, the most micro-batches whose activations are held at once.

    A forward stores a micro-batch's activations until its backward frees them.
    """
    peaks = []
    for row in table:
        held = peak = 0
        for action in row:
            if action is not None:
                held += 1 if action.kind == "F" else -1
                peak = max(peak, held)
        peaks.append(peak)
    return peaks


def check_microbatches(batch_size: int, num_microbatches: int,
                       num_stages: int = 1) -> int:
    """Check a batch splits into equal micro-batches; return the micro-batch size.

    A batch that does not divide is a ValueError: the last micro-batch would differ
    and crash a rank (input and target sizes). Fewer micro-batches than stages is
    legal but wasteful (a warning): some stages idle at every step. The hangs it
    recalls were PyTorch bugs (PiPPy #1064, torchtitan #775), not a rule.
    """
    _check_counts(num_stages, num_microbatches, 1)
    if batch_size % num_microbatches:
        raise ValueError(_(
            "Batch size {batch_size} does not split into {num_microbatches} equal "
            "micro-batches ({batch_size} % {num_microbatches} = {remainder}). Use a "
            "batch size that is a multiple of {num_microbatches}, or a micro-batch "
            "count that divides {batch_size}.").format(
                batch_size=batch_size, num_microbatches=num_microbatches,
                remainder=batch_size % num_microbatches))
    if num_microbatches < num_stages:
        bubble = bubble_theory(num_stages, num_microbatches)
        warnings.warn(_(
            "{num_microbatches} micro-batch(es) for {num_stages} stages: legal, but at "
            "least {idle} stage(s) idle at every step; the bubble is {bubble:.0%} of "
            "the time. Use num_microbatches >= {enough} (4 x stages) to keep it small."
        ).format(num_microbatches=num_microbatches, num_stages=num_stages,
                 idle=num_stages - num_microbatches, bubble=bubble,
                 enough=4 * num_stages), stacklevel=2)
    return batch_size // num_microbatches


def split_microbatches(inputs, targets, num_microbatches: int, num_stages: int = 1):
    """Split a batch into equal (inputs, targets) micro-batches, after checking them."""
    if len(inputs) != len(targets):
        raise ValueError(_("inputs hold {inputs} samples but targets {targets}."
                           ).format(inputs=len(inputs), targets=len(targets)))
    check_microbatches(len(inputs), num_microbatches, num_stages)
    return list(zip(inputs.chunk(num_microbatches), targets.chunk(num_microbatches)))
