"""Lab 09's room: Training that survives: snapshots, elastic restarts, hangs.

Taught in: ``solutions/09_fault_tolerance.ipynb`` (the learner's copy in ``labs/``),
which imports ``from labkit.labs.fault_tolerance import checks``. What is here belongs to
this lab alone; what several labs share is in ``labkit`` itself.

- ``snapshots``: the snapshot a step takes and resumes from.
- ``elastic``: what a script under torchrun's elastic agent reads (restarts, world size).
- ``node_faults``: a namespace node killed or cut off mid-training (root).
- ``watchdog``: how a hang ends on NCCL (an abort), told apart from other failures.
- ``checks``: the exercises' checks (snapshot and resume, elastic restart, the hang finder).
- ``reference.json``: the solved exercises, for ``checks.use_reference(...)``
  (written by ``labkit build-labs``; a graded course leaves it out).
"""
