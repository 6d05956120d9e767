"""labkit: the helpers behind the hands-on multi-GPU training course.

One module per idea of the course, each saying in its docstring where it is taught:
``mode`` (quick/full, the call that opens every lab), ``hardware`` and ``estimate``
(lab 00), ``data``, ``models`` and ``train`` (lab 01), ``dataparallel`` (lab 02),
``launch`` (lab 03 and every lab after it; ``room`` shares one machine among a
room of learners), ``timeline``, ``pipeline``,
``pipeline_run``, ``stages`` and ``p2p`` (labs 04-05), ``comm_model``,
``compression``, ``local_sgd`` and ``bottleneck`` (lab 06), ``sharded``,
``sharding_memory`` and ``memory_probe`` (lab 07), ``tensor_parallel`` and
``latency_model`` (lab 08), ``snapshots`` and ``elastic`` (lab 09), ``cluster`` and
``multinode`` (real nodes on one machine, as root: labs 03, 06, 09), ``explorers``
(the widgets), ``checks`` (every lab's exercises, one module per lab), ``course``
(building labs/ from solutions/), ``bench`` (the benchmarks, one module each) and
``cli`` (the ``labkit`` command), ``predict`` (the Predict cells' ``reveal``).

Import the modules you need (``from labkit import data, train``); importing
``labkit`` itself stays cheap and never touches a GPU.
"""

__version__ = "0.1.0"

from labkit.mode import begin, is_quick, pick
from labkit.predict import reveal

__all__ = ["begin", "is_quick", "pick", "reveal", "__version__"]
