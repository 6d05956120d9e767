"""Lab 08's room: Tensor parallelism and model-parallel inference latency.

Taught in: ``solutions/08_tensor_parallel.ipynb`` (the learner's copy in ``labs/``),
which imports ``from labkit.labs.tensor_parallel import checks``. What is here belongs to
this lab alone; what several labs share is in ``labkit`` itself.

- ``tensor_parallel``: the Megatron MLP and block, split by columns and rows.
- ``latency_model``: the latency of one request, layer by layer, on a stated cluster.
- ``checks``: the exercises' checks (the TP MLP, the TP block, DP x TP, request time).
- ``reference.json``: the solved exercises, for ``checks.use_reference(...)``
  (written by ``labkit build-labs``; a graded course leaves it out).
"""
