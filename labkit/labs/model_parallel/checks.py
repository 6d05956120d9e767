"""Checks for lab 04 (layer-wise model parallelism): a balanced cut, the split training
step over send/recv, how long two devices work at once, and serving requests through
the split model.

The program checks launch the learner's module on 2 gloo ranks (``stages.run_program``,
``stages.run_serve``) inside ``p2p.bounded``: a rank that waits too long for a message
stops and says which, so a forgotten send becomes a hint instead of a hang. Results
are compared with the unsplit model (``stages.reference``), tensor by tensor, rank by
rank.
"""

import math
import re

import torch
from torch import nn

from labkit import models, stages, timeline
from labkit.checks._core import ExerciseFailed, attempt, expect_close, passed
from labkit.checks._reference import use_reference
from labkit.checks._solved import has_passed, solved
from labkit.checks._programs import launch_program, load_program
from labkit.checks._split import (BOUND_S, CONFIG, NOT_CHECKED, TOLERANCE,
                                  explain_messages, first_gap)
from labkit.messages import _

__all__ = ["use_reference", "solved", "has_passed",
           "split_in_two", "split_step", "overlap_seconds", "serve"]

# ---------------------------------------------------------------- exercise 4.1


def split_in_two(fn) -> None:
    """Check ``fn(model) -> (first, second)``: balanced halves sharing the weights."""
    name = "split_in_two"
    for num_layers in (4, 6, 8):
        model = models.deep_mlp(num_layers, width=32)
        halves = attempt(name, fn, model)
        if not (isinstance(halves, (tuple, list)) and len(halves) == 2):
            raise ExerciseFailed(_("{name}: return a pair (first, second), got "
                                   "{halves!r}.").format(name=name, halves=halves))
        first, second = halves
        x = torch.randn(3, 1, 28, 28)
        if not torch.allclose(second(first(x)), model(x)):
            raise ExerciseFailed(_("{name}: second(first(x)) differs from model(x) "
                                   "for deep_mlp({num_layers}): keep every layer, in "
                                   "order.").format(name=name, num_layers=num_layers))
        ours = {id(p) for p in model.parameters()}
        if any(id(p) not in ours for h in halves for p in h.parameters()):
            raise ExerciseFailed(_("{name}: the halves hold copies of the weights; "
                                   "slice the model (model[:cut]) so they share its "
                                   "parameters.").format(name=name))
        counts = [sum(isinstance(m, nn.Linear) for m in h) for h in halves]
        if counts[0] != counts[1]:
            raise ExerciseFailed(_("{name}: deep_mlp({num_layers}) cut into "
                                   "{first} + {second} Linear layers: cut at the "
                                   "middle Linear so each device gets the same work."
                                   ).format(name=name, num_layers=num_layers,
                                            first=counts[0], second=counts[1]))
    passed(name, _("Slicing keeps parameter names (`9.weight`): state dicts still "
                   "match."))


# ---------------------------------------------------------------- exercise 4.2


def _explain_step(text: str) -> str | None:
    """Name the classic mistake behind a rank's failure in the split step."""
    if re.search(r"rank 0 waited .* dist\.recv\(src=1\)", text):
        return _("Rank 0 waited in its backward for the gradient of its output, "
                 "which never came: after its backward the last rank must send the "
                 "gradient of what it received back, dist.send(inputs.grad, "
                 "dst=ctx.rank - 1).")
    if re.search(r"rank 1 waited .* dist\.recv\(src=0\)", text):
        return _("Rank 1 waited for the activations: in forward every rank but the "
                 "last sends its out (detached) to ctx.rank + 1.")
    if "blocking dist.send" in text:
        return _("A blocking send waits until the other rank posts the matching recv: "
                 "every send needs a recv on the other side, in the same order.")
    return explain_messages(text)


def split_step(path="split_step.py", bound_s: float = BOUND_S) -> None:
    """Check the learner's split step on 2 gloo ranks against the unsplit model.

    Launches ``train_step`` of the module at ``path`` through ``stages.run_program``;
    every rank's gradients must equal the whole model's to ``TOLERANCE``.
    """
    name = "split_step"
    module = load_program(path)
    program = stages.Program(module.__name__, "train_step", "batch", bound_s=bound_s)
    ranks = launch_program(name, stages.run_program, 2, args=(program, [CONFIG]),
                           timeout=60, explain=_explain_step, module=module.__name__)
    want = stages.reference(CONFIG)
    gap = first_gap(want["grads"], ranks, CONFIG)
    if gap:
        rank, tensor, size = gap
        hint = (_("It got no gradient: rank 0's backward must call out.backward(grad) "
                  "with the gradient received from rank 1.") if math.isinf(size) else
                _("Does each rank receive what the other sent, in the same order?"))
        raise ExerciseFailed(_("{name}: rank {rank}'s gradient of {tensor} differs "
                               "from the unsplit model's by {gap:.2e} (tolerance "
                               "{tolerance:g}). {hint}").format(
                                   name=name, rank=rank, tensor=tensor, gap=size,
                                   tolerance=TOLERANCE, hint=hint))
    loss = ranks[-1]["runs"][0]["loss"]
    expect_close(name, loss, want["loss"], _("the loss returned by the last rank"),
                 _("On the last rank, forward returns the loss as out."), rel=1e-5)
    passed(name, _("Both ranks' gradients equal the unsplit model's (to "
                   "{tolerance:g}); one tensor crossed the cut each way. {not_checked}"
                   ).format(tolerance=TOLERANCE, not_checked=_(NOT_CHECKED)))


# ---------------------------------------------------------------- exercise 4.3


def _events(rows):
    return [timeline.Event(row, kind, 0, start, end) for row, kind, start, end in rows]


def overlap_seconds(fn) -> None:
    """Check ``fn(events) -> seconds`` during which two or more rows are busy."""
    name = "overlap_seconds"
    cases = [(_("one row after the other"), _events([(0, "F", 0, 1), (1, "F", 1, 2)])),
             (_("half overlapping"), _events([(0, "F", 0, 2), (1, "F", 1, 3)])),
             (_("unsorted, three rows"), _events([(2, "B", 5, 6), (0, "F", 0, 4),
                                                  (1, "F", 1, 2), (1, "B", 3, 5)]))]
    for case, events in cases:
        got = attempt(name, fn, events)
        want = timeline.busy_overlap(events)
        hint = _("Sort the start and end moments, walk them keeping a count of busy "
                 "rows, and add up the time while the count is 2 or more.")
        expect_close(name, got, want, case, hint)
    passed(name, _("A measured split model overlaps by ~0 s: one device works at a "
                   "time."))


# ---------------------------------------------------------------- exercise 4.4


def _explain_serve(text: str) -> str | None:
    """Name the classic mistake behind a rank's failure while serving."""
    if re.search(r"rank 0 waited .* dist\.recv\(src=1\)", text):
        return _("Rank 0 waited for the answer, which never came: the last rank must "
                 "send its logits back to rank 0 (dist.send(out, dst=0)).")
    if "with a buffer of shape" in text:
        return _("A receive buffer must have the sender's shape: activations are "
                 "(len(request), width); the answer is the logits, (len(request), 10).")
    return _explain_step(text)


def serve(path="split_serve.py", count: int = 4, bound_s: float = BOUND_S) -> None:
    """Check the learner's ``serve`` answers requests like the unsplit model.

    Launches ``serve`` of the module at ``path`` through ``stages.run_serve`` on 2 gloo
    ranks; rank 0's answers must equal the whole model's logits, and no message may
    carry an autograd graph (serving needs no backward).
    """
    name = "serve"
    module = load_program(path)
    ranks = launch_program(name, stages.run_serve, 2,
                           args=(module.__name__, CONFIG, count, bound_s), timeout=60,
                           explain=_explain_serve, module=module.__name__)
    with torch.no_grad():
        want = stages.whole_model(CONFIG).eval()(stages.requests(CONFIG, count)[:, 0])
    answers = ranks[0]["answers"]
    if any(not torch.is_tensor(a) or a.numel() != 10 for a in answers):
        raise ExerciseFailed(_("{name}: rank 0 returned {answer!r}: serve must "
                               "return the logits, shape (1, 10), on rank 0.").format(
                                   name=name, answer=answers[0]))
    gap = (torch.cat([a.reshape(1, 10) for a in answers]) - want).abs().max().item()
    if gap > TOLERANCE * 10:
        raise ExerciseFailed(_("{name}: rank 0's answers differ from the unsplit "
                               "model's logits by {gap:.2e}: run each stage on what it "
                               "received and send the last stage's output back."
                               ).format(name=name, gap=gap))
    graphs = [m for r in ranks for m in r["messages"] if m["requires_grad"]]
    if graphs or any(ranks[0]["answer_requires_grad"]):
        raise ExerciseFailed(_(
            "{name}: the answers are right, but tensors that require grad were sent "
            "or returned: serving builds no graph. Run the stage under `with "
            "torch.no_grad():`, or every request keeps its activations for a backward "
            "that never comes.").format(name=name))
    passed(name, _("{count} requests answered on rank 0 like the unsplit model; each "
                   "crossed the cut and came back. {not_checked}").format(
                       count=count, not_checked=_(NOT_CHECKED)))
