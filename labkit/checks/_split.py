"""What the lab 04 and lab 05 program checks share: a model split over 2 ranks, its
gradients compared with the unsplit model's rank by rank, and the hints for messages
that went wrong (``p2p.bounded`` names them in the rank)."""

from labkit import stages
from labkit.checks._programs import first_difference
from labkit.messages import N_, _
from labkit.stages import split_stages

__all__ = ["TOLERANCE", "BOUND_S", "CONFIG", "NOT_CHECKED", "first_gap",
           "explain_messages"]

TOLERANCE = 1e-6    # split vs whole model, every gradient (float rounding: ~1e-9)
BOUND_S = 15.0      # a rank waiting this long for one message is stuck, not slow
CONFIG = stages.Config(num_layers=4, width=32, batch=16)
NOT_CHECKED = N_("Not checked here: NCCL and CUDA tensors (the check runs on gloo CPU "
                 "ranks), e.g. a buffer made without device=ctx.device.")   # used as _()


def _own_names(cfg: stages.Config, rank: int, world_size: int) -> set:
    """Return the names of the parameters rank ``rank`` holds after the split."""
    stage = split_stages(stages.whole_model(cfg), world_size)[rank]
    return {name for name, _param in stage.named_parameters()}


def first_gap(want: dict, ranks: list, cfg: stages.Config, run: int = 0,
              scale: float = 1.0) -> tuple | None:
    """Return (rank, name, gap) of the first gradient off ``scale`` x ``want``.

    ``ranks`` are ``stages.run_program`` results; ``run`` indexes their runs. A
    parameter without a gradient counts as a gap of ``inf``. None when all agree.
    """
    for rank, result in enumerate(ranks):
        mine = {name: grad * scale for name, grad in want.items()
                if name in _own_names(cfg, rank, len(ranks))}
        gap = first_difference(mine, result["runs"][run]["grads"], TOLERANCE * scale)
        if gap:
            return rank, *gap
    return None


def explain_messages(text: str) -> str | None:
    """Name the classic mistake behind a failed message in a rank's traceback."""
    if "that is not a tensor" in text and "dist.send(None" in text:
        return _("The gradient of the received activations is None: autograd fills "
                 ".grad only for a leaf tensor that requires grad, and the received "
                 "activations are a new leaf, cut off from the sender's graph (what "
                 ".detach() makes in one process). Call requires_grad_() on them right "
                 "after dist.recv, before the stage's forward.")
    if "with a buffer of shape" in text:
        return _("A receive buffer must have the sender's shape and dtype: activations "
                 "are (batch, width), e.g. torch.empty(len(x), width); a gradient has "
                 "the shape of the out it belongs to, torch.empty_like(out).")
    if "implicitly created only for scalar outputs" in text:
        return _("Only the loss is a scalar: on the other ranks out is (batch, width), "
                 "so call out.backward(grad) with the gradient received from the next "
                 "rank.")
    return None
