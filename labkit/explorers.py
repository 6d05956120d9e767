"""Interactive widgets (ipywidgets) that let a learner explore a model by hand.

Taught in: lab 05 (``pipeline_schedules``: stages, micro-batches, schedule -> the
chart and the bubble). They only draw what ``pipeline`` computes; nothing here runs
a training step.
"""

import os

from labkit import pipeline, timeline

__all__ = ["pipeline_schedules", "is_static"]

# A static page (the course book, LABKIT_STATIC=1) has no kernel behind its widgets:
# there an explorer draws its default setting once and says what the controls are.
STATIC_ENV = "LABKIT_STATIC"
_STATIC_NOTE = ("(A static page: in JupyterLab this cell shows controls for {controls}; "
                "here is its default setting.)")


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

    stages = widgets.IntSlider(4, min=2, max=8, description="stages p")
    micro = widgets.IntSlider(8, min=1, max=32, description="micro-batches m")
    chunks = widgets.IntSlider(2, min=2, max=4, description="chunks v")
    name = widgets.Dropdown(options=list(pipeline.SCHEDULES), value="gpipe",
                            description="schedule")
    out = _StaticOutput() if is_static() else widgets.Output()

    def redraw(_=None):
        out.clear_output(wait=True)
        with out:
            v = chunks.value if name.value == "interleaved_1f1b" else 1
            try:
                table = pipeline.schedule(name.value, stages.value, micro.value, v)
            except ValueError as err:
                print(err)
                return
            chunk_text = f", v={v}" if v > 1 else ""
            timeline.draw(table, title=f"{name.value}: p={stages.value}, "
                                       f"m={micro.value}{chunk_text}")
            plt.show()
            theory = pipeline.bubble_theory(stages.value, micro.value, v)
            print(f"bubble: {pipeline.bubble_fraction(table):.1%} of the time "
                  f"(formula {theory:.1%}); peak activations held per rank: "
                  f"{pipeline.peak_activations(table)}")

    for widget in (stages, micro, chunks, name):
        widget.observe(redraw, names="value")
    if is_static():
        print(_STATIC_NOTE.format(controls="the schedule, stages, micro-batches and "
                                           "chunks"))
        redraw()
        return None
    redraw()
    box = widgets.VBox([widgets.HBox([name, stages]), widgets.HBox([micro, chunks]),
                        out])
    display(box)
    return box


# ---------------------------------------------------------------- lab 07


def _fit_parts(shape, gpus, stage, seq_len, micro_batch, checkpointing) -> dict:
    """Return {part: GiB} on one GPU for a MODEL_SHAPES entry (mixed-precision Adam)."""
    from labkit import sharding_memory

    num_params, layers, hidden, heads = shape
    parts = sharding_memory.zero_bytes_per_rank(num_params, gpus, stage)
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
                             value="Llama 2 13B", description="model")
    gpus = widgets.Dropdown(options=[2**k for k in range(11)], value=8,
                            description="GPUs N")
    stage = widgets.Dropdown(options=[(text, s) for s, text in
                                      sharding_memory.STAGES.items()],
                             value=3, description="ZeRO stage")
    seq_len = widgets.Dropdown(options=[512, 1024, 2048, 4096, 8192], value=2048,
                               description="sequence")
    micro = widgets.IntSlider(1, min=1, max=16, description="micro-batch")
    recompute = widgets.Checkbox(False, description="activation checkpointing")
    out = _StaticOutput() if is_static() else widgets.Output()

    def redraw(_=None):
        out.clear_output(wait=True)
        with out:
            parts = _fit_parts(sharding_memory.MODEL_SHAPES[model.value], gpus.value,
                               stage.value, seq_len.value, micro.value, recompute.value)
            total = sum(parts.values())
            fig, ax = plt.subplots(figsize=(8, 1.8))
            left = 0.0
            for part, gib in parts.items():
                ax.barh([0], [gib], left=left, label=f"{part} {gib:.1f}")
                left += gib
            ax.axvline(capacity_gib, color="black", linestyle="--")
            ax.set_yticks([])
            ax.set_xlabel("GiB on one GPU (dashed: its memory)")
            ax.legend(fontsize=8, ncol=4, loc="upper center",
                      bbox_to_anchor=(0.5, -0.6))
            plt.show()
            verdict = "fits" if total <= capacity_gib else "does NOT fit"
            print(f"{model.value}, {gpus.value} GPU(s), "
                  f"{sharding_memory.STAGES[stage.value]}: {total:.1f} GiB per GPU "
                  f"of {capacity_gib:.0f} GiB: {verdict} (leave 10-20 % for the CUDA "
                  "context and fragmentation)")

    for widget in (model, gpus, stage, seq_len, micro, recompute):
        widget.observe(redraw, names="value")
    if is_static():
        print(_STATIC_NOTE.format(controls="the model, GPUs, ZeRO stage, sequence, "
                                           "micro-batch and checkpointing"))
        redraw()
        return None
    redraw()
    box = widgets.VBox([widgets.HBox([model, gpus, stage]),
                        widgets.HBox([seq_len, micro, recompute]), out])
    display(box)
    return box


__all__.append("sharding_fit")
