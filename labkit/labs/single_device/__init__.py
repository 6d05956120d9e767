"""Lab 01's room: One device, done right: the MNIST baseline.

Taught in: ``solutions/01_single_device_mnist.ipynb`` (the learner's copy in ``labs/``),
which imports ``from labkit.labs.single_device import checks``. What is here belongs to
this lab alone; what several labs share is in ``labkit`` itself.

- ``checks``: the exercises' checks (device choice, transform, mini-batches, the training step).
- ``loading``: section 4's verdict: the fast path vs the DataLoader, next to the theory.
- ``bench_data_loading``: ``labkit bench data``: the device-resident fast path vs the DataLoader.
- ``reference.json``: the solved exercises, for ``checks.use_reference(...)``
  (written by ``labkit build-labs``; a graded course leaves it out).
"""
