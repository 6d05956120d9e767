"""Lab 04's room: Model parallelism: when one device is not enough.

Taught in: ``solutions/04_model_parallel.ipynb`` (the learner's copy in ``labs/``),
which imports ``from labkit.labs.model_parallel import checks``. What is here belongs to
this lab alone; what several labs share is in ``labkit`` itself.

- ``checks``: the exercises' checks (the split, its training step, serving, the overlap).
- ``reference.json``: the solved exercises, for ``checks.use_reference(...)``
  (written by ``labkit build-labs``; a graded course leaves it out).
"""
