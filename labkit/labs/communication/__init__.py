"""Lab 06's room: Communication: measure it, model it, shrink it.

Taught in: ``solutions/06_communication.ipynb`` (the learner's copy in ``labs/``),
which imports ``from labkit.labs.communication import checks``. What is here belongs to
this lab alone; what several labs share is in ``labkit`` itself.

- ``comm_model``: the alpha-beta model of a collective, fitted to measurements.
- ``compression``: DDP communication hooks (fp16/bf16, PowerSGD) and their byte counts.
- ``local_sgd``: local SGD: average the parameters every few steps.
- ``bottleneck``: where a step's time goes: profiler phases, stragglers, buckets, GPU use.
- ``real_link``: hooks on a real shaped link between namespace nodes (root).
- ``checks``: the exercises' checks (all-reduce timing, the cast hook, local SGD).
- ``bench_allreduce``: ``labkit bench allreduce``: time, algbw, busbw and the alpha-beta fit.
- ``bench_compression``: ``labkit bench compression``: hooks' bytes, step time, accuracy.
- ``reference.json``: the solved exercises, for ``checks.use_reference(...)``
  (written by ``labkit build-labs``; a graded course leaves it out).
"""
