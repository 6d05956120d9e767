"""Lab 05's room: Pipeline parallelism: filling the bubble.

Taught in: ``solutions/05_pipeline_parallel.ipynb`` (the learner's copy in ``labs/``),
which imports ``from labkit.labs.pipeline import checks``. What is here belongs to
this lab alone; what several labs share is in ``labkit`` itself.

- ``pipeline_run``: schedules run for real: in order, or one thread per stage.
- ``explorer``: the schedule explorer widget.
- ``checks``: the exercises' checks (the GPipe table, the GPipe step, 1F1B).
- ``bench_pipeline_bubble``: ``labkit bench pipeline``: the measured bubble vs (p-1)/(m+p-1).
- ``reference.json``: the solved exercises, for ``checks.use_reference(...)``
  (written by ``labkit build-labs``; a graded course leaves it out).
"""
