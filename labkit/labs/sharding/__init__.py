"""Lab 07's room: When the model does not fit: ZeRO, FSDP2, checkpointing.

Taught in: ``solutions/07_sharding.ipynb`` (the learner's copy in ``labs/``),
which imports ``from labkit.labs.sharding import checks``. What is here belongs to
this lab alone; what several labs share is in ``labkit`` itself.

- ``sharding_memory``: bytes per rank for each ZeRO stage, and a transformer's activations.
- ``sharded``: the sharded runs measured on ranks (ZeRO-1, FSDP2, DCP).
- ``explorer``: the fit explorer widget.
- ``checks``: the exercises' checks (bytes per rank, ZeRO-1, FSDP2, checkpointed forward).
- ``reference.json``: the solved exercises, for ``checks.use_reference(...)``
  (written by ``labkit build-labs``; a graded course leaves it out).
"""
