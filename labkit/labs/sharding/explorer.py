"""The fit explorer: model, GPUs, ZeRO stage, checkpointing -> one GPU's memory.

Taught in: lab 07 (``sharding_fit``). It only draws what ``sharding_memory``
computes.
"""

from labkit import explorers, timeline
from labkit.labs.sharding import sharding_memory
from labkit.messages import N_, _

__all__ = ["sharding_fit"]

# The parts of one GPU's memory (sharding_memory.KINDS, and the activations), as shown.
_PART_NAMES = {"parameters": N_("parameters"), "gradients": N_("gradients"),
               "optimizer states": N_("optimizer states"),
               "activations": N_("activations")}

def _fit_parts(shape, gpus, stage, seq_len, micro_batch, checkpointing) -> dict:
    """Return {part: GiB} on one GPU for a MODEL_SHAPES entry (mixed-precision Adam)."""
    num_params, layers, hidden, heads = shape
    parts = sharding_memory.zero_bytes_per_rank(num_params, gpus, stage)   # KINDS
    parts["activations"] = sharding_memory.transformer_activation_bytes(
        layers, hidden, heads, seq_len, micro_batch, checkpointing)
    return {part: nbytes / 2**30 for part, nbytes in parts.items()}


def sharding_fit(capacity_gib=None):
    """Show model, GPUs, ZeRO stage, checkpointing; draw one GPU's GiB vs its memory.

    ``capacity_gib``: the GPU's memory (default: GPU 0's if there is one, else what
    torch reports on an H200, ``sharding_memory.H200_TORCH_GIB``). Lab 07.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    import torch

    if capacity_gib is None and torch.cuda.is_available():
        capacity_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    elif capacity_gib is None:
        capacity_gib = sharding_memory.H200_TORCH_GIB
    model = widgets.Dropdown(options=list(sharding_memory.MODEL_SHAPES),
                             value="Llama 2 13B", description=_("model"))
    gpus = widgets.Dropdown(options=[2**k for k in range(11)], value=8,
                            description=_("GPUs N"))
    stage = widgets.Dropdown(options=[(_(text), s) for s, text in
                                      sharding_memory.STAGES.items()],
                             value=3, description=_("ZeRO stage"))
    seq_len = widgets.Dropdown(options=[512, 1024, 2048, 4096, 8192], value=2048,
                               description=_("sequence"))
    micro = widgets.IntSlider(1, min=1, max=16, description=_("micro-batch"))
    recompute = widgets.Checkbox(False, description=_("activation checkpointing"))
    out = explorers.output()

    def redraw(_change=None):
        out.clear_output(wait=True)
        with out:
            parts = _fit_parts(sharding_memory.MODEL_SHAPES[model.value], gpus.value,
                               stage.value, seq_len.value, micro.value, recompute.value)
            total = sum(parts.values())
            timeline.use_cjk_font()
            fig, ax = plt.subplots(figsize=(8, 1.8))
            left = 0.0
            for part, gib in parts.items():
                shown = _(_PART_NAMES[part]) if part in _PART_NAMES else part
                ax.barh([0], [gib], left=left, label=f"{shown} {gib:.1f}")
                left += gib
            ax.axvline(capacity_gib, color="black", linestyle="--")
            ax.set_yticks([])
            ax.set_xlabel(_("GiB on one GPU (dashed: its memory)"))
            ax.legend(fontsize=8, ncol=4, loc="upper center",
                      bbox_to_anchor=(0.5, -0.6))
            plt.show()
            verdict = _("fits") if total <= capacity_gib else _("does NOT fit")
            print(_("{model}, {gpus} GPU(s), {stage}: {total:.1f} GiB per GPU of "
                    "{capacity:.0f} GiB: {verdict} (leave 10-20 % for the CUDA context "
                    "and fragmentation)").format(
                        model=model.value, gpus=gpus.value,
                        stage=_(sharding_memory.STAGES[stage.value]), total=total,
                        capacity=capacity_gib, verdict=verdict))

    return explorers.show([[model, gpus, stage], [seq_len, micro, recompute]], out,
                          redraw, _("the model, GPUs, ZeRO stage, sequence, "
                                    "micro-batch and checkpointing"))

