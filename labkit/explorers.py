"""Interactive widgets (ipywidgets) that let a learner explore a model by hand.

Taught in: lab 05 (``pipeline_schedules``: stages, micro-batches, schedule -> the
chart and the bubble). They only draw what ``pipeline`` computes; nothing here runs
a training step.
"""

import os

from labkit import pipeline, timeline
from labkit.messages import N_, _

__all__ = ["pipeline_schedules", "is_static"]

# A static page (the course book, LABKIT_STATIC=1) has no kernel behind its widgets:
# there an explorer draws its default setting once and says what the controls are.
STATIC_ENV = "LABKIT_STATIC"
_STATIC_NOTE = N_("(A static page: in JupyterLab this cell shows controls for "
                  "{controls}; here is its default setting.)")


def is_static() -> bool:
    """Tell whether outputs go to a static page (no live widgets)."""
    return os.environ.get(STATIC_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


class _StaticOutput:
    """Stands in for ``widgets.Output`` on a static page: prints go straight out."""

    def clear_output(self, wait: bool = False) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


def pipeline_schedules():
    """Show sliders and a schedule menu; redraw the chart and bubble % on change."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    stages = widgets.IntSlider(4, min=2, max=8, description=_("stages p"))
    micro = widgets.IntSlider(8, min=1, max=32, description=_("micro-batches m"))
    chunks = widgets.IntSlider(2, min=2, max=4, description=_("chunks v"))
    name = widgets.Dropdown(options=list(pipeline.SCHEDULES), value="gpipe",
                            description=_("schedule"))
    out = _StaticOutput() if is_static() else widgets.Output()

    def redraw(_change=None):
        out.clear_output(wait=True)
        with out:
            v = chunks.value if name.value == "interleaved_1f1b" else 1
            try:
                table = pipeline.schedule(name.value, stages.value, micro.value, v)
            except ValueError as err:
                print(err)
                return
            chunk_text = f", v={v}" if v > 1 else ""
            timeline.draw(table, title=_("{schedule}: p={stages}, m={microbatches}"
                                         "{chunks}").format(
                schedule=name.value, stages=stages.value, microbatches=micro.value,
                chunks=chunk_text))
            plt.show()
            theory = pipeline.bubble_theory(stages.value, micro.value, v)
            print(_("bubble: {bubble:.1%} of the time (formula {theory:.1%}); peak "
                    "activations held per rank: {peaks}").format(
                        bubble=pipeline.bubble_fraction(table), theory=theory,
                        peaks=pipeline.peak_activations(table)))

    for widget in (stages, micro, chunks, name):
        widget.observe(redraw, names="value")
    if is_static():
        print(_(_STATIC_NOTE).format(controls=_("the schedule, stages, micro-batches "
                                                "and chunks")))
        redraw()
        return None
    redraw()
    box = widgets.VBox([widgets.HBox([name, stages]), widgets.HBox([micro, chunks]),
                        out])
    display(box)
    return box


# ---------------------------------------------------------------- lab 07

# The parts of one GPU's memory (sharding_memory.KINDS, and the activations), as shown.
_PART_NAMES = {"parameters": N_("parameters"), "gradients": N_("gradients"),
               "optimizer states": N_("optimizer states"),
               "activations": N_("activations")}

def _fit_parts(shape, gpus, stage, seq_len, micro_batch, checkpointing) -> dict:
    """Return {part: GiB} on one GPU for a MODEL_SHAPES entry (mixed-precision Adam)."""
    from labkit import sharding_memory

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
    from IPython.display import display

    from labkit import sharding_memory

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
    out = _StaticOutput() if is_static() else widgets.Output()

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

    for widget in (model, gpus, stage, seq_len, micro, recompute):
        widget.observe(redraw, names="value")
    if is_static():
        print(_(_STATIC_NOTE).format(controls=_("the model, GPUs, ZeRO stage, "
                                                "sequence, micro-batch and "
                                                "checkpointing")))
        redraw()
        return None
    redraw()
    box = widgets.VBox([widgets.HBox([model, gpus, stage]),
                        widgets.HBox([seq_len, micro, recompute]), out])
    display(box)
    return box


__all__.append("sharding_fit")
