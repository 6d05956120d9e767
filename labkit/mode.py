"""Quick or full mode, and ``begin``: the one call that opens every lab.

Taught in: every lab's setup cell. Quick mode (``LABKIT_QUICK=1``) shrinks data and
steps so CI runs every notebook in seconds; learners get full mode.
"""

import os
import sys

from labkit.messages import _

__all__ = ["QUICK_ENV", "is_quick", "pick", "describe", "begin"]

QUICK_ENV = "LABKIT_QUICK"


def is_quick() -> bool:
    """Tell whether quick mode is on (``LABKIT_QUICK`` set to 1/true/yes/on)."""
    return os.environ.get(QUICK_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def pick(full, quick):
    """Return ``quick`` in quick mode, else ``full`` (sizes, steps, epochs)."""
    return quick if is_quick() else full


def describe() -> str:
    """Say which mode is on and how to switch."""
    if is_quick():
        return _("Mode: QUICK ({env}=1): small subsets and few steps, numbers are "
                 "only indicative. Unset it for the full lab.").format(env=QUICK_ENV)
    return _("Mode: FULL: the real data and step counts. Set {env}=1 for a fast smoke "
             "run.").format(env=QUICK_ENV)


def begin(world_size: int = 1, backend: str = "auto", mnist: bool = False):
    """Print the mode, the hardware found and the backend this lab will use; return it.

    Returns a ``hardware.Setup`` (backend, device type, world size and the reason):
    the lab's one backend. "auto" takes NCCL only when there is a GPU for each of
    ``world_size`` ranks, else gloo on CPU ranks. Pass ``backend=setup.backend`` to
    every ``launch.run`` whose numbers the lab compares (1 rank vs 2, say): a 1-rank
    job left to "auto" would take the GPU that a 2-rank job cannot, and a launch
    prints a note when that happens. With several ranks it also starts
    ``launch.warm_up()`` so the first launch is quick. ``mnist=True`` prepares MNIST
    here, once, before any rank needs it.
    """
    import torch

    from labkit import hardware

    print(describe())
    from labkit.messages import language

    if language() != "en":   # the notebook's own plots draw Chinese with a CJK font too
        from labkit.timeline import use_cjk_font

        use_cjk_font()
    if mnist:
        from labkit import data

        print(_("MNIST ready in {folder} (MD5-checked)").format(
            folder=data.prepare() / "MNIST" / "raw"))
    print(_("PyTorch {version} (built for CUDA {cuda}), {cores} CPU core(s) "
            "available").format(version=torch.__version__,
                                cuda=torch.version.cuda or _("none"),
                                cores=hardware.cpu_count()))
    setup = hardware.choose(world_size, backend)
    hardware.remember_lab(setup)
    from labkit.checks._reference import record_begin

    record_begin(sys._getframe(1).f_globals)   # when the room records (labkit.progress)
    hardware.record_choice("begin", setup)
    if world_size > 1:   # start the rank factory in the background: launches are quick
        from labkit import launch

        launch.warm_up()
    return setup
