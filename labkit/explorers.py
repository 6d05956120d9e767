"""What the interactive explorers (ipywidgets) share: live controls in JupyterLab, and
on a static page (the course book) their default setting drawn once.

Taught in: labs 05 and 07, whose rooms hold their explorers
(``labkit.labs.pipeline.explorer``, ``labkit.labs.sharding.explorer``). An explorer
builds its controls, an ``output()`` and a ``redraw`` function, then calls ``show``.
"""

import os

from labkit.messages import N_, _

__all__ = ["is_static", "output", "show"]

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


def output():
    """Return where an explorer draws: a ``widgets.Output``, or prints on a static page."""
    if is_static():
        return _StaticOutput()
    import ipywidgets as widgets

    return widgets.Output()


def show(rows: list, out, redraw, controls: str):
    """Lay out ``rows`` of controls above ``out``, redraw on every change, display.

    On a static page: say what the controls are (``controls``), draw once, return
    None; else return the widget box.
    """
    for row in rows:
        for widget in row:
            widget.observe(redraw, names="value")
    if is_static():
        print(_(_STATIC_NOTE).format(controls=controls))
        redraw()
        return None
    import ipywidgets as widgets
    from IPython.display import display

    redraw()
    box = widgets.VBox([widgets.HBox(row) for row in rows] + [out])
    display(box)
    return box
