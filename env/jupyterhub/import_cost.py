"""What one process pays, in memory of its own, to import the course's torch. Run it
with the course's Python on the server you are sizing:

    /opt/course/venv/bin/python env/jupyterhub/import_cost.py

An idle learner is mostly this: their kernel has imported torch and torchvision, and
so has the launcher's helper while it is up (INSTRUCTORS.md, "Sizing a room, from a
rehearsal"). Memory of its own is the process's anonymous memory (RssAnon): no other
process shares it, however many learners import the same torch, so each learner adds
it again. File-backed pages (the libraries' code) are shared by the whole room.

Torch's CUDA build loads the CUDA libraries at import whether or not the machine has a
GPU (libtorch.so needs libtorch_cuda.so, which needs cuBLAS and the rest, and loading
them runs their initialisers); torch's CPU build has none of them. The steps run in
order in one fresh process, so each line is what that step added.
"""

import argparse
import ctypes
import importlib.util
import json
import platform
import sys
from pathlib import Path

MiB = 1024   # /proc reports kB
CUDA_STEP = "torch's CUDA libraries (libtorch_cuda, cuBLAS, cuDNN, NCCL, ...)"


def _own_mib() -> float:
    """This process's anonymous resident memory, in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / MiB
    raise RuntimeError("no RssAnon in /proc/self/status: this needs Linux")


def _torch_lib() -> Path:
    """torch/lib, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("import_cost: torch is not installed in this Python "
                         f"({sys.executable}); run it with the course's Python")
    return Path(spec.submodule_search_locations[0]) / "lib"


def measure() -> list[tuple[str, float]]:
    """(step, MiB of its own that the step added), in order, in this process, which
    must not have imported torch yet."""
    if "torch" in sys.modules:
        raise RuntimeError("measure() needs a process that has not imported torch")
    lib = _torch_lib()
    steps = [("Python", _own_mib())]

    def step(name, action):
        before = _own_mib()
        action()
        steps.append((name, _own_mib() - before))

    cpu, cuda = lib / "libtorch_cpu.so", lib / "libtorch_cuda.so"
    # Loaded as torch loads them (RTLD_GLOBAL), so `import torch` finds them in place.
    if cpu.exists():
        step("torch's CPU library (libtorch_cpu)",
             lambda: ctypes.CDLL(str(cpu), mode=ctypes.RTLD_GLOBAL))
    if cuda.exists():
        step(CUDA_STEP, lambda: ctypes.CDLL(str(cuda), mode=ctypes.RTLD_GLOBAL))
    step("the rest of import torch", lambda: __import__("torch"))
    if importlib.util.find_spec("torchvision") is not None:
        step("import torchvision (it imports torch._dynamo)",
             lambda: __import__("torchvision"))
    steps.append(("total", _own_mib()))
    return steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the steps as JSON")
    options = parser.parse_args(argv)
    steps = measure()
    import torch

    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
    if options.json:
        print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                          "steps": steps}))
        return 0
    print(f"torch {torch.__version__} ({build}), Python {platform.python_version()}, "
          f"{sys.executable}")
    print("memory of its own (MiB) that one process adds at each step:")
    width = max(len(name) for name, _ in steps)
    for name, mib in steps:
        print(f"  {name:<{width}}  {mib:6.0f}")
    if torch.version.cuda and not torch.cuda.is_available():
        cuda_mib = dict(steps).get(CUDA_STEP, 0.0)
        print(f"This machine shows no GPU, yet every process that imports this torch "
              f"holds {cuda_mib:.0f} MiB for the CUDA libraries: on a server without "
              "GPUs, torch's CPU build (--index-url https://download.pytorch.org/whl/cpu "
              "for torch and torchvision) saves that in every kernel and launcher helper.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
