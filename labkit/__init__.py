"""labkit: the helpers behind the hands-on multi-GPU training course.

One module per idea of the course, each saying in its docstring where it is taught:
``mode`` (quick/full, the call that opens every lab), ``hardware`` and ``estimate``
(lab 00), ``data``, ``models`` and ``train`` (lab 01), ``dataparallel`` (lab 02),
``launch`` and ``ddp`` (lab 03), ``timeline``, ``pipeline``, ``pipeline_run``,
``stages`` and ``p2p`` (labs 04-05), ``checks`` (every lab's exercises), ``course``
(building labs/ from solutions/), ``bench`` (measured claims) and ``cli`` (the
``labkit`` command).

Import the modules you need (``from labkit import data, train``); importing
``labkit`` itself stays cheap and never touches a GPU.
"""

__version__ = "0.1.0"

from labkit.mode import begin, is_quick, pick

__all__ = ["begin", "is_quick", "pick", "__version__"]
