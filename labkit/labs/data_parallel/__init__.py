"""Lab 02's room: Data parallelism by hand, then nn.DataParallel.

Taught in: ``solutions/02_data_parallel.ipynb`` (the learner's copy in ``labs/``),
which imports ``from labkit.labs.data_parallel import checks``. What is here belongs to
this lab alone; what several labs share is in ``labkit`` itself.

- ``dataparallel``: labkit's data-parallel step (replicate, scatter, parallel_apply, gather): the reference.
- ``checks``: the exercises' checks (the data-parallel step, parallel_apply, the module. prefix).
- ``reference.json``: the solved exercises, for ``checks.use_reference(...)``
  (written by ``labkit build-labs``; a graded course leaves it out).
"""
