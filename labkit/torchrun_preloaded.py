"""``torchrun --standalone`` whose worker processes start with torch already imported.

Where it is used: lab 03's check ``ddp_under_torchrun`` and lab 09's
``elastic_restart``, which run the learner's script under torchrun and must answer in
seconds on a loaded classroom server. A real ``torchrun`` starts every worker as a
fresh ``python script.py``, and each one imports torch: on a busy 2-core machine that
is seconds per worker (twice in lab 09: the first start and the restart), most of
the check's wait. Lab 09 then times a restart under the real torchrun
(``timed_restart``), since the new Python and ``import torch`` are what a restart
costs, and prints both.

``python -m labkit.torchrun_preloaded [torchrun's options] script.py [args]`` takes
torchrun's own options (its parser, ``torch.distributed.run.get_args_parser``) and
runs the same elastic agent (``elastic_launch``, what torchrun calls), with the
same rendezvous, environment variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``TORCHELASTIC_RESTART_COUNT`` ...), restarts and exit codes. Only
the workers differ: each is forked from this process (torchrun's ``--start-method
fork``, for a function entrypoint), which then runs the script as ``__main__`` with
its arguments in ``sys.argv``. Forking after importing torch is safe here because
this process never touches CUDA (the checks hide the GPUs). The lab's own cells
run the real ``torchrun``, as a learner types it.
"""

import logging
import os
import runpy
import signal
import sys
import traceback
import uuid

import torch.distributed  # noqa: F401  (preloaded for the workers: the point)
import torch._dynamo  # noqa: F401  (what DistributedDataParallel imports)
from torch.distributed import run as torchrun
from torch.distributed.launcher.api import elastic_launch

__all__ = ["main"]


def _run_script(path: str, *argv: str) -> None:
    """A worker: run ``path`` as ``python path argv...`` would."""
    # A forked worker inherits the agent's handlers, which turn SIGTERM into a Python
    # exception: one that never runs while the worker is blocked inside C++ (a store
    # read, gloo's connect), so when another rank fails the agent waits 30 s before
    # it SIGKILLs this one. A fresh `python script.py` dies at once on SIGTERM.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
    except Exception:   # to stderr, as `python path` shows it; torchrun records it too
        traceback.print_exc()
        sys.stderr.flush()
        raise


def main(argv: list[str] | None = None) -> None:
    """Parse torchrun's options, then run the script's workers forked from here."""
    parser = torchrun.get_args_parser()
    args = parser.parse_args(argv)
    if not args.standalone or args.module or args.no_python:
        parser.error("labkit.torchrun_preloaded runs a script with --standalone only")
    # As torchrun.run does for --standalone: a c10d rendezvous on a free local port.
    args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
    args.rdzv_id = str(uuid.uuid4())
    args.master_port = args.master_port or 29500   # unused by c10d; torchrun sets it
    args.start_method = "fork"
    config, _command, _command_args = torchrun.config_from_args(args)
    elastic_launch(config, _run_script)(args.training_script, *args.training_script_args)
    # Every worker has exited and the rendezvous is closed: skip Python's teardown of
    # torch (about a second and a half on a busy 2-core machine). A failure above
    # raises instead, and exits the usual way, printing torchrun's summary.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
