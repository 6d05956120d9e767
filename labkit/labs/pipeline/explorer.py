"""The pipeline-schedule explorer: stages, micro-batches, schedule -> the chart and the bubble.

Taught in: lab 05 (``pipeline_schedules``). It only draws what ``labkit.pipeline``
computes; nothing here runs a training step.
"""

from labkit import explorers, pipeline, timeline
from labkit.messages import _

__all__ = ["pipeline_schedules"]


def pipeline_schedules():
    """Show sliders and a schedule menu; redraw the chart and bubble % on change."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    stages = widgets.IntSlider(4, min=2, max=8, description=_("stages p"))
    micro = widgets.IntSlider(8, min=1, max=32, description=_("micro-batches m"))
    chunks = widgets.IntSlider(2, min=2, max=4, description=_("chunks v"))
    name = widgets.Dropdown(options=list(pipeline.SCHEDULES), value="gpipe",
                            description=_("schedule"))
    out = explorers.output()

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

    return explorers.show([[name, stages], [micro, chunks]], out, redraw,
                          _("the schedule, stages, micro-batches and chunks"))
