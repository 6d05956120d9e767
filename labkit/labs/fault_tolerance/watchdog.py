"""How a hang ends on NCCL, told apart from every other way a launch can fail.

Taught in: lab 09's appendix ("On NCCL: no exception, an abort"). A collective that
waits past the group's timeout makes NCCL's watchdog abort the rank (SIGABRT, with
``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``, the default), or the launcher stops ranks that
outlive the others (``launch.CollectiveTimeout``). The demo expects one of those; any
other failure (a rank that raised, an NCCL initialisation error, a rank killed
otherwise, a launch that never ended) is a real error, and the demo lets it through.
"""

import re
import signal

from labkit import launch

__all__ = ["ended_a_hang"]

# launch.run says "Rank N exited with code -6 ..." (in the learner's language, the
# code a number): the only trace of the exit code it gives today.
_ABORTED = re.compile(rf"(?<![\w.-]){-signal.SIGABRT}(?![\w.])")


def ended_a_hang(err: Exception) -> bool:
    """True if ``err``, from ``launch.run``, is how NCCL or the launcher ends a hang."""
    if isinstance(err, launch.CollectiveTimeout):
        return True
    return type(err) is launch.LaunchError and bool(_ABORTED.search(str(err)))
