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


def unsplit_block(state: dict, cfg, x, bias_scale: float = 1.0,
                  attention: dict | None = None) -> dict:
    """Run one whole gpt.Block on ``x`` with the probe loss; ``bias_scale``
    multiplies the biases of out and fc2 (a bias added on every TP rank);
    ``attention`` sets gpt.Attention's ``scale`` or ``causal`` (a classic mistake)."""
    block = gpt.Block(cfg.model.width, cfg.model.num_heads)
    block.load_state_dict(state)
    for name, value in (attention or {}).items():
        setattr(block.attn, name, value)
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
    for attention, text in _attention_mistakes(cfg.model, tp):
        if _close(got["out"], unsplit_block(state, cfg, x, attention=attention)["out"]):
            return text
    return _("one all-reduce after attention's output projection, one after fc2, "
             "each bias added after its sum.")


def _attention_mistakes(model, tp: int) -> list:
    """(gpt.Attention's settings, the hint) of attention's classic mistakes."""
    head_dim, width = model.width // model.num_heads, model.width
    right = _("the scale is 1/sqrt(head_dim) = 1/sqrt({head_dim}), per head, whatever "
              "the split.").format(head_dim=head_dim)
    return [
        ({"causal": False}, _("attention saw later tokens: the causal mask is missing "
                              "(is_causal=True, or a lower-triangular mask before the "
                              "softmax).")),
        ({"scale": (width // tp) ** -0.5},
         _("the scores were scaled by 1/sqrt({local}), this rank's width C/tp: ")
         .format(local=width // tp) + right),
        ({"scale": width ** -0.5},
         _("the scores were scaled by 1/sqrt({width}), the whole width C: ")
         .format(width=width) + right),
        ({"scale": 1 / head_dim},
         _("the scores were scaled by 1/{head_dim}, without the square root: ")
         .format(head_dim=head_dim) + right),
        ({"scale": 1.0}, _("the scores were not scaled: ") + right),
    ]


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
    if "labkit check" in text and "in dist.all_reduce over ranks" in text:
        return _("A rank of that group never joined the all-reduce: every rank of a "
                 "group must call each of its collectives. The tied wte's gradient goes "
                 "over a group of each pipeline's first and last stage only "
                 "(Megatron-LM's embedding group): with pp > 2 the middle stages hold "
                 "no wte and never call it. Make one such group per pipeline (every "
                 "rank makes every group, in one order) and pass it to sync_tied.")
    if "but got <class 'NoneType'>" in text:
        return _("A tensor to send was None: the gradient of a received activation. "
                 "Call requires_grad_() on the received buffer before the stage's "
                 "forward, so that backward leaves its gradient in x.grad to send "
                 "back.")
    if "index out of range in self" in text:
        return _("An embedding was given an index past its size: a micro-batch's "
                 "inputs are w[:, :-1] (T tokens) and its targets w[:, 1:], not the "
                 "whole window of T + 1.")
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
    """Per step of one DP run: (asynchronous all-reduces launched in backward,
    all-reduces, bytes, blocking all-reduces in backward)."""
    steps = {}
    for entry in comm:
        phase = entry["phase"]
        if entry["op"] != "all_reduce" or not isinstance(phase, tuple) \
                or phase[0] != accumulations:
            continue
        during, total, nbytes, blocking = steps.get(phase[1], (0, 0, 0, 0))
        in_backward = phase[2] == "backward"
        steps[phase[1]] = (during + (in_backward and entry["async"]), total + 1,
                           nbytes + entry["bytes"],
                           blocking + (in_backward and not entry["async"]))
    return steps


def dp_behaviour(result: dict, accumulations: int) -> str | None:
    """Say what the messages show is not bucketed or not overlapped (None: fine)."""
    params, param_bytes = result["params"], result["param_bytes"]
    for step, (during, total, nbytes, blocking) in sorted(
            dp_messages(result["comm"], accumulations).items()):
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
        if blocking:
            return _("{blocking} of {total} all-reduces ran in backward but blocking "
                     "(async_op=False): backward stopped until each one ended, so "
                     "nothing overlapped. Launch each bucket with async_op=True, keep "
                     "its handle, and wait for it in wait().").format(
                         blocking=blocking, total=total)
        if during < 2:
            return _("{during} of {total} all-reduces started during backward: the "
                     "others waited for wait(). Launch each bucket from the hook of "
                     "its last gradient, with async_op=True, so that it travels while "
                     "backward computes the earlier layers.").format(during=during,
                                                                      total=total)
    return None
