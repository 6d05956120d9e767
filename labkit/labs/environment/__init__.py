"""Lab 00's room: Why several GPUs, and what is in your machine.

Taught in: ``solutions/00_environment_and_hardware.ipynb`` (the learner's copy in ``labs/``),
which imports ``from labkit.labs.environment import checks``. What is here belongs to
this lab alone; what several labs share is in ``labkit`` itself.

- ``checks``: the exercises' checks (parameter count, training memory, all-reduce time).
- ``reference.json``: the solved exercises, for ``checks.use_reference(...)``
  (written by ``labkit build-labs``; a graded course leaves it out).
"""
