"""Find the hardware, report it, and choose a backend and devices, saying why.

Taught in: lab 00 (environment checks: nvidia-smi, CUDA driver vs toolkit vs the CUDA
inside the torch wheel, PATH/LD_LIBRARY_PATH); ``choose`` opens every later lab.
Nothing here initialises CUDA in the calling process, so it is safe before a fork.
"""

import json
import math
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from labkit.messages import _

__all__ = [
    "Setup",
    "BACKENDS",
    "CHOICE_LOG_ENV",
    "choose",
    "remember_lab",
    "lab_setup",
    "record_choice",
    "driver_compatibility",
    "as_device",
    "cpu_count",
    "memory_available_bytes",
    "report",
    "print_report",
]

BACKENDS = ("auto", "nccl", "gloo")
# When set, every backend a lab or a launch really uses is appended there as one JSON
# line, with what was asked for and the GPUs the process saw (env/gpu_check.py reads
# it to report what each notebook ran on, and to fail a silent fall-back to gloo).
CHOICE_LOG_ENV = "LABKIT_CHOICE_LOG"
# The oldest driver (major version) each CUDA major runs on, by CUDA's minor-version
# compatibility: a wheel built with any 12.x runs on a driver >= 525, any 13.x on a
# driver >= 580 (NVIDIA, "CUDA Compatibility", minor version compatibility table).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}


@dataclass(frozen=True)
class Setup:
    """What a lab runs on: backend, device type, number of ranks, and why."""

    backend: str  # "nccl" or "gloo"
    device_type: str  # "cuda" or "cpu"
    world_size: int
    reason: str
    asked: str = "auto"   # what the caller asked for: "auto", "nccl" or "gloo"

    def device(self, rank: int = 0) -> torch.device:
        """Return the device of ``rank``: its own GPU with NCCL, else the CPU."""
        if self.device_type == "cuda":
            return torch.device("cuda", rank % max(1, torch.cuda.device_count()))
        return torch.device("cpu")

    def devices(self) -> str:
        """Say which devices the ranks use: "cuda:0,cuda:1", or "cpu x2"."""
        if self.device_type == "cuda":
            return ",".join(str(self.device(r)) for r in range(self.world_size))
        return f"cpu x{self.world_size}"


_LAB: list = []   # the Setup of the lab running in this process (labkit.begin)


def remember_lab(setup: Setup) -> None:
    """Note ``setup`` as this lab's (``labkit.begin`` does, once per notebook)."""
    _LAB[:] = [setup]


def lab_setup() -> Setup | None:
    """Return the Setup ``labkit.begin`` chose in this process, or None."""
    return _LAB[0] if _LAB else None


def record_choice(where: str, setup: Setup, what: str = "") -> None:
    """Append what ran where to the file ``LABKIT_CHOICE_LOG`` names (if set)."""
    path = os.environ.get(CHOICE_LOG_ENV)
    if not path:
        return
    line = {"where": where, "what": what, "backend": setup.backend,
            "device_type": setup.device_type, "world_size": setup.world_size,
            "devices": setup.devices(), "asked": setup.asked,
            "gpus": torch.cuda.device_count()}   # what this process could see
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


CGROUP = "/sys/fs/cgroup"   # cgroup v2: where a container's CPU and memory limits live


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_count() -> int:
    """Return the CPU cores this process may use (taskset, and a container's quota)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no sched_getaffinity
        cores = os.cpu_count() or 1
    quota = (_read(f"{CGROUP}/cpu.max") or "max").split()
    if quota[0] != "max" and len(quota) == 2:   # "200000 100000": 2 cores' worth
        cores = min(cores, max(1, math.ceil(int(quota[0]) / int(quota[1]))))
    return cores


def memory_available_bytes() -> int | None:
    """Return the memory this process may still use: the machine's available
    memory, or what is left under a container's limit if that is less."""
    meminfo = _read("/proc/meminfo")
    if meminfo is None:
        return None
    fields = {line.split(":")[0]: line.split()[1] for line in meminfo.splitlines()}
    available = int(fields.get("MemAvailable", fields.get("MemFree", 0))) * 1024
    limit, used = _read(f"{CGROUP}/memory.max"), _read(f"{CGROUP}/memory.current")
    if limit and limit != "max" and used:
        available = min(available, int(limit) - int(used))
    return available


def _check_world_size(world_size) -> None:
    if (
        not isinstance(world_size, int)
        or isinstance(world_size, bool)
        or world_size < 1
    ):
        raise ValueError(_("world_size must be a positive integer (the number of "
                           "ranks), got {world_size!r}.").format(world_size=world_size))


def choose(world_size: int = 1, backend: str = "auto", verbose: bool = True) -> Setup:
    """Choose NCCL with one GPU per rank when possible, else gloo with CPU ranks.

    ``backend="nccl"`` insists on GPUs and raises when there are too few;
    ``"gloo"`` always runs ranks as CPU processes. Prints one line saying why.
    """
    _check_world_size(world_size)
    if backend not in BACKENDS:
        raise ValueError(_("Unknown backend {backend!r}: choose one of {choices}.")
                         .format(backend=backend, choices=", ".join(BACKENDS)))
    found = torch.cuda.device_count()
    have_nccl = dist.is_available() and dist.is_nccl_available()
    if backend == "nccl" and (found < world_size or not have_nccl):
        raise ValueError(_no_nccl_advice(world_size, found, have_nccl))
    if backend == "gloo":
        setup = Setup("gloo", "cpu", world_size,
                      _("gloo asked for: ranks are CPU processes"), asked="gloo")
    else:
        setup = replace(_auto(found, world_size, have_nccl), asked=backend)
    if verbose:
        _announce(setup, found)
    return setup


def _no_nccl_advice(world_size: int, found: int, have_nccl: bool) -> str:
    """Say why NCCL cannot run ``world_size`` ranks here, and what to ask for instead."""
    if not have_nccl:
        why = _("this PyTorch has no NCCL")
    elif found == 0:
        why = _("this machine has no GPU PyTorch can see")
    else:
        why = _("{world_size} rank(s) asked, {found} GPU(s) found").format(
            world_size=world_size, found=found)
        return _("NCCL needs one GPU per rank: {why}. Ask for world_size <= {found}, "
                 "or use backend='gloo' to run the ranks as CPU processes.").format(
                     why=why, found=found)
    return _("NCCL needs one GPU per rank: {why}. Use backend='gloo' to run the ranks "
             "as CPU processes.").format(why=why)


def _auto(found: int, world_size: int, have_nccl: bool) -> Setup:
    """Pick NCCL with one GPU per rank when there are enough GPUs, else gloo on CPU."""
    if found >= world_size and have_nccl:
        why = _("{found} GPU(s) found, {world_size} rank(s) wanted: one GPU per rank, "
                "NCCL between them").format(found=found, world_size=world_size)
        return Setup("nccl", "cuda", world_size, why)
    why = (_("this PyTorch has no NCCL") if found and not have_nccl
           else _("{found} GPU(s) found, {world_size} rank(s) wanted").format(
               found=found, world_size=world_size))
    return Setup("gloo", "cpu", world_size,
                 _("{why}: ranks run as CPU processes with gloo (same code, slower; the "
                   "lab says where numbers differ from GPUs)").format(why=why))


def _announce(setup: Setup, found: int) -> None:
    """Print the one line that says what was chosen and why."""
    if setup.world_size == 1:
        where = _(", using the first") if setup.device_type == "cuda" else _(": one process")
        print(_("Device: {device} - {found} GPU(s) found{where} (multi-process labs "
                "print their backend when they start)").format(
                    device=setup.device_type, found=found, where=where))
    else:
        print(backend_line(setup))


def backend_line(setup: Setup) -> str:
    """The line every multi-rank lab and launch prints: the backend, and why."""
    return _("Backend: {backend} on {device}, {n} rank(s) - {reason}").format(
        backend=setup.backend, device=setup.device_type, n=setup.world_size,
        reason=setup.reason)


def as_device(device) -> torch.device:
    """Turn "cpu", "cuda", "cuda:N" or a torch.device into one this machine has.

    Raises ValueError, with what to pass instead, for unknown strings, for GPUs
    that are not there, and for "cpu:1" (PyTorch has one CPU device, not several).
    """
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(_("Unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'.")
                         .format(device=device)) from err
    found = torch.cuda.device_count()
    if parsed.type == "cuda" and (parsed.index or 0) >= found:
        choices = "'cpu'" + (_(" or 'cuda:0' to 'cuda:{last}'").format(last=found - 1)
                             if found else "")
        raise ValueError(_("Device {device!r} asked for, but this machine has {found} "
                           "GPU(s). Use {choices}; `labkit doctor` shows what PyTorch "
                           "sees.").format(device=device, found=found, choices=choices))
    if parsed.type == "cpu" and parsed.index not in (None, 0):
        raise ValueError(_("{device!r} is not a second device: PyTorch puts every CPU "
                           "tensor on 'cpu'. For two CPU workers, launch two ranks.")
                         .format(device=device))
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(_("The labs run on 'cpu' or 'cuda', got {device!r}.").format(
            device=device))
    return parsed


def _run(cmd: list[str]) -> str | None:
    """Return a command's stdout, or None when it is missing or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _memory_gib() -> str:
    """Return total and available RAM, in GiB (a container's limit counts)."""
    meminfo, available = _read("/proc/meminfo"), memory_available_bytes()
    if meminfo is None or available is None:
        return _("unknown (no /proc/meminfo)")
    total = int(meminfo.split("MemTotal:")[1].split()[0]) * 1024
    return _("{total:.1f} GiB total, {available:.1f} GiB available").format(
        total=total / 2**30, available=available / 2**30)


def _shm_gib() -> str:
    """Return the size of /dev/shm (DataLoader workers and NCCL need it in Docker)."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return _("none")
    return f"{stat.f_frsize * stat.f_blocks / 2**30:.1f} GiB"


def _gpu_rows() -> list[tuple[str, str]]:
    rows = []
    smi = _run(
        [
            "nvidia-smi",
            "--query-gpu=index,name,memory.total,driver_version",
            "--format=csv,noheader",
        ]
    )
    if smi:
        rows += [("nvidia-smi GPU", line) for line in smi.splitlines()]
        topo = _run(["nvidia-smi", "topo", "-m"])
        rows.append(("nvidia-smi topo -m", "\n" + topo if topo else _("not available")))
    else:
        rows.append(
            ("nvidia-smi", _("not found or failed: no NVIDIA driver visible here"))
        )
    return rows


def driver_compatibility(driver: str | None, wheel_cuda: str | None) -> str:
    """Say whether an NVIDIA driver (e.g. "570.86.15") runs a wheel's CUDA ("13.0").

    CUDA's minor-version compatibility: a program built with any CUDA 13.x runs on
    every driver >= 580, the oldest driver of the 13 family, even one whose
    ``nvidia-smi`` header says an older 13.y; across majors it does not (a CUDA 13
    wheel on a 570 driver: "The NVIDIA driver on your system is too old"). A few
    features (compiling PTX newer than the driver) need the newer driver.
    """
    if not wheel_cuda:
        return _("CPU-only wheel: no NVIDIA driver needed")
    major = int(wheel_cuda.split(".")[0])
    need = MIN_DRIVER.get(major)
    rule = _("CUDA {major}.x runs on drivers >= {need} (minor-version compatibility: "
             "same major, at least its oldest driver)").format(
                 major=major, need=need) if need else ""
    if driver is None:
        return _("no NVIDIA driver found; this wheel is CUDA {cuda}: {rule}").format(
            cuda=wheel_cuda, rule=rule)
    have = int(driver.split(".")[0])
    if need is None or have >= need:
        return _("driver {driver} runs this wheel's CUDA {cuda}: {rule}").format(
            driver=driver, cuda=wheel_cuda, rule=rule)
    fits = [m for m, oldest in sorted(MIN_DRIVER.items()) if have >= oldest]
    instead = _(", or install a wheel built for CUDA {major}.x").format(
        major=fits[-1]) if fits else ""
    return _("driver {driver} is too old for this wheel's CUDA {cuda}: {rule}. "
             "Update the driver{instead}").format(driver=driver, cuda=wheel_cuda,
                                                  rule=rule, instead=instead)


def _driver_version() -> str | None:
    """Return the NVIDIA driver's version from nvidia-smi, or None without one."""
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return smi.splitlines()[0].strip() if smi else None


def report() -> list[tuple[str, str]]:
    """Collect the environment as (label, value) rows; works with no GPU."""
    nvcc = _run(["nvcc", "--version"])
    rows = [
        ("Python", f"{platform.python_version()} ({sys.executable})"),
        (_("Platform"), platform.platform()),
        ("PyTorch", torch.__version__),
        (_("CUDA inside the torch wheel"),
         torch.version.cuda or _("none (CPU-only build)")),
        ("torch.cuda.is_available()", str(torch.cuda.is_available())),
        ("torch.cuda.device_count()", str(torch.cuda.device_count())),
        *_gpu_rows(),
        (_("driver vs wheel"),
         driver_compatibility(_driver_version(), torch.version.cuda)),
        (
            _("nvcc (CUDA toolkit on PATH)"),
            nvcc.splitlines()[-1]
            if nvcc
            else _("not on PATH (fine: the wheel brings CUDA)"),
        ),
        ("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", _("(not set)"))),
        ("LD_LIBRARY_PATH", os.environ.get("LD_LIBRARY_PATH", _("(not set)"))),
        (_("gloo available"), str(dist.is_available() and dist.is_gloo_available())),
        (_("NCCL available"), str(dist.is_available() and dist.is_nccl_available())),
        (_("CPU cores"), _("{usable} usable of {all}").format(usable=cpu_count(),
                                                               all=os.cpu_count())),
        (_("RAM"), _memory_gib()),
        ("/dev/shm", _shm_gib()),
    ]
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        rows.append(   # total_memory is bytes; GiB = 2**30 bytes (nvidia-smi: MiB)
            (f"cuda:{i}", f"{props.name}, {props.total_memory / 2**30:.1f} GiB")
        )
    return rows


def _columns(text: str) -> int:
    """How many terminal columns ``text`` takes (a Chinese character takes two)."""
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def print_report() -> Setup:
    """Print the environment report and the backend a 2-rank lab would choose."""
    rows = report()
    width = max(_columns(label) for label, _value in rows)
    for label, value in rows:
        print(f"{label}{' ' * (width - _columns(label))}  {value}")
    world_size = max(2, torch.cuda.device_count())
    print("\n" + _("A {n}-rank lab on this machine:").format(n=world_size))
    return choose(world_size)
