"""The one-process run every layout is compared with: the whole GPT, the whole batch.

Taught in: lab 10. Same model (``gpt.build``: same seed, same weights), same batches,
same optimizer as the ranks; the loss of a step is the mean over every token of the
global batch. ``train`` keeps the weights after every step, so a check can say at
which step, and in which tensor, a layout first went another way.

Why SGD for the checks: its update is linear in the gradient, so the few-ulp
difference that another summation order makes (gloo adds the ranks' gradients in
another order than one backward does) stays a few ulps in the weights. Adam divides
by the root of the squared gradient: for a gradient that is nearly zero, a rounding
difference becomes a difference of a whole learning-rate-sized step.
"""

import torch

from labkit.labs.capstone import gpt
from labkit.labs.capstone.layout import RunConfig
from labkit.messages import _

__all__ = ["TOLERANCE", "make_optimizer", "step_loss", "train", "gradients"]

# A layout equals one process when every loss is within TOLERANCE (relative) and every
# weight within TOLERANCE (absolute) after every step: float32 rounding of another
# summation order is ~1e-7 here (measured: tests/labs/capstone/test_reference.py).
TOLERANCE = 1e-5


def make_optimizer(params, cfg: RunConfig) -> torch.optim.Optimizer:
    """Return the run's optimizer over ``params``: SGD with momentum, or AdamW."""
    params = list(params)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)


def step_loss(model, window) -> torch.Tensor:
    """The mean next-byte loss of ``window`` (B, T + 1) tokens: inputs, then targets."""
    return gpt.loss_of(model(window[:, :-1]), window[:, 1:])


def _weights(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train(cfg: RunConfig, batches: torch.Tensor, lr_scale: float = 1.0) -> dict:
    """Train the whole GPT in this process on each (B, T + 1) batch in turn.

    Returns {"losses": [loss of each step], "weights": [whole weights after each
    step], "start": the weights before the first step, "norms": [the gradient's L2
    norm before clipping, each step, when ``cfg.max_norm`` clips it]}. ``lr_scale``
    multiplies the learning rate: with SGD, gradients k times too large train
    exactly like k times the learning rate (how a check recognises them).
    """
    if batches.dim() != 3:
        raise ValueError(_("batches must be (steps, batch, context + 1) tokens, got "
                           "shape {shape}.").format(shape=tuple(batches.shape)))
    model = gpt.build(cfg.model)
    optimizer = make_optimizer(model.parameters(), cfg)
    for group in optimizer.param_groups:
        group["lr"] *= lr_scale
    found = {"losses": [], "weights": [], "start": _weights(model), "norms": []}
    for window in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = step_loss(model, window)
        loss.backward()
        if cfg.max_norm is not None:   # the whole model's norm, the tied wte once
            found["norms"].append(torch.nn.utils.clip_grad_norm_(
                model.parameters(), cfg.max_norm).item())
        optimizer.step()
        found["losses"].append(loss.item())
        found["weights"].append(_weights(model))
    return found


def gradients(cfg: RunConfig, window: torch.Tensor,
              weights: dict | None = None) -> dict:
    """Return the whole GPT's gradients on one batch (at ``weights``, default the
    start), and its loss, as {"loss": float, "grads": {name: tensor}}."""
    model = gpt.build(cfg.model)
    if weights is not None:
        model.load_state_dict(weights, strict=False)
    loss = step_loss(model, window)
    loss.backward()
    return {"loss": loss.item(),
            "grads": {name: p.grad for name, p in model.named_parameters()}}
