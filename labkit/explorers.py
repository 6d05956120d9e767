"""Interactive widgets (ipywidgets) that let a learner explore a model by hand.

Taught in: lab 05 (``pipeline_schedules``: stages, micro-batches, schedule -> the
chart and the bubble). They only draw what ``pipeline`` computes; nothing here runs
a training step.
"""

from labkit import pipeline, timeline

__all__ = ["pipeline_schedules"]


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
    out = widgets.Output()

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
    redraw()
    box = widgets.VBox([widgets.HBox([name, stages]), widgets.HBox([micro, chunks]),
                        out])
    display(box)
    return box
