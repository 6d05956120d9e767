"""The hints of the capstone's piece checks (exercises 10.1-10.3), each read from what
the ranks computed and the collectives they sent: how many all-reduces, of how many
bytes, over which ranks, in which phase; which whole-model variant the numbers equal.

Taught in: lab 10. ``checks`` calls these only once a result is wrong (or, for the
buckets, once the messages show the piece does not bucket or overlap).
"""

import torch

from labkit.labs.capstone import gpt, pieces
from labkit.messages import _

__all__ = ["unsplit_block", "tp_output_hint", "tp_input_grad_hint", "explain_rank",
           "dp_messages", "dp_behaviour"]


def unsplit_block(state: dict, cfg, x, bias_scale: float = 1.0) -> dict:
    """Run one whole gpt.Block on ``x`` with the probe loss; ``bias_scale``
    multiplies the biases of out and fc2 (a bias added on every TP rank)."""
    block = gpt.Block(cfg.model.width, cfg.model.num_heads)
    block.load_state_dict(state)
    with torch.no_grad():
        block.attn.out.bias *= bias_scale
        block.mlp.fc2.bias *= bias_scale
    x = x.detach().clone().requires_grad_()
    out = block(x)
    (out * pieces.probe(out.shape)).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad,
            "grads": {name: p.grad for name, p in block.named_parameters()}}


def _reduces(comm: list, phase: str) -> list:
    return [entry for entry in comm if entry["op"] == "all_reduce"
            and entry["phase"] == phase]


def _close(a, b) -> bool:
    return a.shape == b.shape and (a.double() - b.double()).abs().max() <= 1e-5


def tp_output_hint(got: dict, group: tuple, state: dict, cfg, x) -> str:
    """Explain a wrong block output from the forward all-reduces and the numbers."""
    forward = _reduces(got["comm"], "forward")
    batch, seq, width = x.shape
    whole = batch * seq * width * 4
    wider = [e for e in forward if e["ranks"] != group]
    if wider:
        return _("an all-reduce went over ranks {ranks}, not this rank's TP group "
                 "{group}: pass group= to every dist.all_reduce (the group "
                 "parallelize_block was given).").format(ranks=list(wider[0]["ranks"]),
                                                         group=list(group))
    if not forward:
        return _("no all-reduce ran in forward: each rank's output is only its partial "
                 "sum (its heads, its hidden features). g (ReduceFromParallel) must "
                 "all-reduce after the output projection and after fc2.")
    odd = [e for e in forward if e["bytes"] != whole]
    if odd:
        features = odd[0]["bytes"] // (batch * seq * 4)
        return _("a forward all-reduce summed a (B, T, {features}) tensor: that is "
                 "this rank's heads (or hidden features) BEFORE the projection, and "
                 "different ranks hold different ones. Project first with your columns "
                 "(F.linear(y, out.weight)), then all-reduce the (B, T, {width}) "
                 "partial sum, then add the bias.").format(features=features,
                                                           width=width)
    if len(forward) > 2:
        return _("{count} all-reduces ran in forward, not 2: f (CopyToParallel) must "
                 "pass x on unchanged in forward (every rank already holds it "
                 "whole).").format(count=len(forward))
    tp = len(group)
    if _close(got["out"], unsplit_block(state, cfg, x, bias_scale=tp)["out"]):
        return _("the biases of out and fc2 are counted {tp} times: every rank added "
                 "its copy before the sum. Add them once, after the all-reduce."
                 ).format(tp=tp)
    return _("one all-reduce after attention's output projection, one after fc2, "
             "each bias added after its sum.")


def tp_input_grad_hint(got: dict, want: dict, tp: int) -> str:
    """Explain a wrong input gradient from the backward all-reduces."""
    backward = _reduces(got["comm"], "backward")
    if not backward:
        return _("no all-reduce ran in backward: each rank holds only the gradient "
                 "through its own heads and features. f's backward must all-reduce "
                 "the input's gradient.")
    if _close(got["x_grad"], tp * want["x_grad"]):
        return _("it is {tp} x too big: g's backward must pass the gradient on "
                 "unchanged (the output's gradient is already whole on every "
                 "rank).").format(tp=tp)
    return _("f: identity forward, all-reduce backward; g: all-reduce forward, "
             "identity "
             "backward.")


def explain_rank(text: str) -> str | None:
    """Name the classic mistake behind a rank's traceback (a stuck message, a shape)."""
    if "labkit check" in text and ("never received" in text or "never sent" in text):
        return _("A message was never matched: in 1F1B each stage sends every "
                 "micro-batch's activations on and every gradient back, and receives "
                 "as many. Does each rank post the same number of sends and receives "
                 "to its neighbour, to its pipeline peer (group_peer), not to "
                 "ctx.rank + 1?")
    if "with a buffer of shape" in text:
        return _("A receive buffer must have the sender's shape: activations and "
                 "their gradients are (micro-batch, T, C), the shape argument.")
    if "is invalid for input of size" in text:
        return _("A rank holds 1/tp of q, k and v's features: it computes num_heads "
                 "/ tp heads, not num_heads.")
    return None


def dp_messages(comm: list, accumulations: int) -> dict:
    """Per step of one DP run: (all-reduces in backward, all-reduces, bytes)."""
    steps = {}
    for entry in comm:
        phase = entry["phase"]
        if entry["op"] != "all_reduce" or not isinstance(phase, tuple) \
                or phase[0] != accumulations:
            continue
        during, total, nbytes = steps.get(phase[1], (0, 0, 0))
        steps[phase[1]] = (during + (phase[2] == "backward"), total + 1,
                           nbytes + entry["bytes"])
    return steps


def dp_behaviour(result: dict, accumulations: int) -> str | None:
    """Say what the messages show is not bucketed or not overlapped (None: fine)."""
    params, param_bytes = result["params"], result["param_bytes"]
    for step, (during, total, nbytes) in sorted(dp_messages(result["comm"],
                                                            accumulations).items()):
        if nbytes != param_bytes:
            return _("with {acc} backward pass(es) per step, step {step} all-reduced "
                     "{got:,} bytes; the gradients hold {want:,}: every gradient goes "
                     "once per step, after its last accumulation.").format(
                         acc=accumulations, step=step, got=nbytes, want=param_bytes)
        if total >= params:
            return _("{total} all-reduces for {params} parameters: one per parameter "
                     "is not bucketing. Flatten a bucket's gradients into one tensor "
                     "(torch.cat) and all-reduce that.").format(total=total,
                                                                params=params)
        if during < 2:
            return _("{during} of {total} all-reduces started during backward: the "
                     "others waited for wait(). Launch each bucket from the hook of "
                     "its last gradient, with async_op=True, so that it travels while "
                     "backward computes the earlier layers.").format(during=during,
                                                                      total=total)
    return None
