"""The benchmarks behind the course's measured claims: ``labkit bench NAME``.

One module per benchmark; each prints what it measures first and its headline as the
last line. This file only names them: importing it does not import torch, so the
``labkit`` command stays quick for verbs that need none.
"""

import importlib

__all__ = ["BENCHMARKS", "run"]

# name -> (module in labkit.bench, function, what it measures)
BENCHMARKS = {
    "data": ("data_loading", "data_loading",
             "batches/s: device-resident fast path vs DataLoader (lab 01)"),
    "launch": ("launch_cost", "launch_cost",
               "a 2-rank launch vs a bare `import torch` (lab 03)"),
    "ddp": ("ddp_scaling", "ddp_scaling",
            "2 DDP ranks vs the no-communication ceiling (labs 03, 06)"),
    "pipeline": ("pipeline_bubble", "bubble_benchmark",
                 "GPipe's measured bubble vs (p-1)/(m+p-1) (lab 05)"),
    "allreduce": ("allreduce", "allreduce",
                  "all-reduce time, algbw, busbw 4 B-64 MiB, alpha-beta fit (lab 06)"),
    "compression": ("compression", "compression_benchmark",
                    "DDP comm hooks: bytes, step time, accuracy (lab 06)"),
}


# options a benchmark accepts besides its defaults (``labkit bench NAME --OPTION``)
OPTIONS = {"allreduce": ("link",)}


def run(name: str, **options):
    """Run the benchmark called ``name``; an unknown name lists the valid ones.

    ``options`` (e.g. ``link="1gbe"`` for allreduce) go to the benchmark; one it
    does not take is refused.
    """
    if name not in BENCHMARKS:
        raise ValueError(
            f"Unknown benchmark {name!r}: choose one of "
            f"{', '.join(sorted(BENCHMARKS))}."
        )
    unknown = set(options) - set(OPTIONS.get(name, ()))
    if unknown:
        raise ValueError(f"Benchmark {name!r} takes no --{', --'.join(sorted(unknown))}"
                         f" (options: {', '.join(OPTIONS.get(name, ())) or 'none'}).")
    module, function, _ = BENCHMARKS[name]
    return getattr(importlib.import_module(f"labkit.bench.{module}"),
                   function)(**options)
