"""The labs' rooms: one package per lab, holding what belongs to that lab alone.

Taught in: each lab's notebook imports its own room (``from labkit.labs.ddp import
checks``). A room holds the lab's reference machinery, its exercises' ``checks``, its
benchmark(s) and its ``reference.json``; it imports from the runtime (``labkit``'s
other modules) and never from another room. What two labs share lives in the runtime.

    environment     lab 00      communication     lab 06
    single_device   lab 01      sharding          lab 07
    data_parallel   lab 02      tensor_parallel   lab 08
    ddp             lab 03      fault_tolerance   lab 09
    model_parallel  lab 04      capstone          lab 10
    pipeline        lab 05

The benchmarks behind the course's measured claims (``labkit bench NAME``) are named
below: importing this file does not import torch, so the ``labkit`` command stays
quick for verbs that need none.
"""

import importlib

__all__ = ["ROOMS", "BENCHMARKS", "run_benchmark"]

ROOMS = {"environment": "00", "single_device": "01", "data_parallel": "02", "ddp": "03",
         "model_parallel": "04", "pipeline": "05", "communication": "06",
         "sharding": "07", "tensor_parallel": "08", "fault_tolerance": "09",
         "capstone": "10"}

# name -> (module in its room, function, what it measures)
BENCHMARKS = {
    "data": ("single_device.bench_data_loading", "data_loading",
             "batches/s: device-resident fast path vs DataLoader (lab 01)"),
    "launch": ("ddp.bench_launch_cost", "launch_cost",
               "a 2-rank launch vs a bare `import torch` (lab 03)"),
    "ddp": ("ddp.bench_ddp_scaling", "ddp_scaling",
            "2 DDP ranks vs the no-communication ceiling (labs 03, 06)"),
    "pipeline": ("pipeline.bench_pipeline_bubble", "bubble_benchmark",
                 "GPipe's measured bubble vs (p-1)/(m+p-1) (lab 05)"),
    "allreduce": ("communication.bench_allreduce", "allreduce",
                  "all-reduce time, algbw, busbw 4 B-64 MiB, alpha-beta fit (lab 06)"),
    "compression": ("communication.bench_compression", "compression_benchmark",
                    "DDP comm hooks: bytes, step time, accuracy (lab 06)"),
}

# options a benchmark accepts besides its defaults (``labkit bench NAME --OPTION``)
OPTIONS = {"allreduce": ("link",)}


def run_benchmark(name: str, **options):
    """Run the benchmark called ``name``; an unknown name lists the valid ones.

    ``options`` (e.g. ``link="1gbe"`` for allreduce) go to the benchmark; one it
    does not take is refused.
    """
    from labkit.messages import _

    if name not in BENCHMARKS:
        raise ValueError(_("Unknown benchmark {name!r}: choose one of {names}.").format(
            name=name, names=", ".join(sorted(BENCHMARKS))))
    unknown = set(options) - set(OPTIONS.get(name, ()))
    if unknown:
        raise ValueError(_("Benchmark {name!r} takes no --{unknown} (options: "
                           "{options}).").format(
                               name=name, unknown=", --".join(sorted(unknown)),
                               options=", ".join(OPTIONS.get(name, ())) or "none"))
    module, function, _ = BENCHMARKS[name]
    return getattr(importlib.import_module(f"labkit.labs.{module}"),
                   function)(**options)
