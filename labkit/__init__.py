"""labkit: the runtime behind the hands-on multi-GPU training course.

What every lab and every rank imports, one module per idea, each saying in its
docstring where it is taught:

- opening a lab: ``mode`` (``begin``, quick and full mode), ``hardware`` (what this
  machine has, the backend choice: lab 00), ``messages`` (the learner's language);
- the single-device baseline: ``data``, ``models``, ``train`` (lab 01), ``estimate``
  (memory and all-reduce estimates: labs 00, 04);
- launching ranks: ``launch`` (lab 03 and every lab after it), ``_spawn`` and
  ``_forkserver`` (the helper ranks fork from), ``scratch`` (the kernel's temp
  folder, gone however the kernel ends), ``crowding`` (launch limits on a machine a
  room of learners shares), ``privacy`` (a job kept to loopback and its own temp
  folder), ``torchrun_preloaded`` (torchrun's agent with workers forked after torch
  is imported: lab 03's torchrun check), ``cluster`` and ``multinode``
  (real nodes on one machine, as root: labs 03, 06, 09);
- cutting a model: ``pipeline`` (schedule tables and the bubble), ``stages`` (a model
  split over ranks), ``p2p`` (send/recv under a deadline), ``nccl_order`` (would
  those messages hang on NCCL?), ``timeline`` (what each rank did, drawn): labs
  04-05; ``memory_probe`` (bytes held, measured: lab 07);
- the labs' shared machinery: ``checks`` (what every exercise check shares),
  ``predict`` (the Predict cells' ``reveal`` and ``guesses``), ``progress`` (a room's
  own times, when it records them), ``explorers`` (the widgets' static fallback),
  ``bench`` (the benchmarks' paired ratios);
- ``labs``: one room per lab, holding what belongs to that lab alone (its reference
  machinery, checks, benchmarks): ``from labkit.labs.ddp import checks``.

The course's tooling (building the learner and Chinese editions, the book, lab times)
is the separate package ``coursetools`` (``tooling/``), which the learner image leaves
out; the ``labkit`` command (``cli``) adds its verbs where it is installed.

Import the modules you need (``from labkit import data, train``); importing
``labkit`` itself stays cheap and never touches a GPU.
"""

__version__ = "0.1.0"

from labkit.mode import begin, is_quick, pick
from labkit.predict import guesses, reveal

__all__ = ["begin", "is_quick", "pick", "reveal", "guesses", "__version__"]
