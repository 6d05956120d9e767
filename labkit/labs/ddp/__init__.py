"""Lab 03's room: DistributedDataParallel: one process per device.

Taught in: ``solutions/03_ddp.ipynb`` (the learner's copy in ``labs/``),
which imports ``from labkit.labs.ddp import checks``. What is here belongs to
this lab alone; what several labs share is in ``labkit`` itself.

- ``checks``: the exercises' checks (shards, the all-reduce worker, the DDP worker, torchrun).
- ``bench_ddp_scaling``: ``labkit bench ddp``: 2 DDP ranks vs the no-communication ceiling.
- ``bench_launch_cost``: ``labkit bench launch``: a 2-rank launch vs a bare ``import torch``.
- ``two_nodes``: the two-node torchrun command, run for real on namespace nodes (root).
- ``reference.json``: the solved exercises, for ``checks.use_reference(...)``
  (written by ``labkit build-labs``; a graded course leaves it out).
"""
