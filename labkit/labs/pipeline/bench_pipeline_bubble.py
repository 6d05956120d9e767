"""``labkit bench pipeline``: GPipe's measured bubble against (p-1)/(m+p-1).

Taught in: lab 05 (the bubble). Runs GPipe from scratch with one thread per stage
(``pipeline_run.run_on_threads``): real forward and backward of small Linear stages,
plus an equal, known cost per action spent *waiting* (``time.sleep``, which frees the
GIL), so that 4 stages overlap even on 2 cores. It measures the schedule, not the
arithmetic. Last line: ``pipeline bubble max deviation: <points> points``.
"""

import torch
from torch import nn

from labkit import hardware, pipeline
from labkit.labs.pipeline.pipeline_run import run_on_threads
from labkit.stages import split_stages

__all__ = ["bubble_benchmark"]


def _measured_bubble(num_stages, num_microbatches, cost_s, repeats) -> float:
    """Return the median measured bubble of GPipe on threads (equal, known costs)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), *[nn.Linear(16, 16) for _ in range(num_stages)])
    batch = 8 * num_microbatches
    inputs, targets = torch.randn(batch, 16), torch.randint(0, 16, (batch,))
    bubbles = []
    for _ in range(repeats):
        stages = split_stages(model, num_stages)
        _, events = run_on_threads(stages, inputs, targets, num_microbatches,
                                   "gpipe", cost_s)
        bubbles.append(pipeline.bubble_fraction(events))
    return sorted(bubbles)[len(bubbles) // 2]


def bubble_benchmark(cost_s: float = 0.04, repeats: int = 3) -> float:
    """Measure GPipe's bubble for p in {2, 4}, m in {1, 2, 4, 8}; return max deviation.

    Prints one line per case and, last, the worst gap to (p-1)/(m+p-1) in points.
    """
    print(f"GPipe from scratch, one thread per stage (16x16 Linear stages, real "
          f"forward and backward); each action also waits {cost_s * 1e3:.0f} ms "
          f"(time.sleep, GIL released): equal, known stage costs that overlap even on "
          f"{hardware.cpu_count()} CPU core(s). Median of {repeats} runs.")
    torch.set_num_threads(1)
    _measured_bubble(2, 2, cost_s / 4, 1)   # warm-up: first calls allocate
    worst = 0.0
    for p in (2, 4):
        for m in (1, 2, 4, 8):
            measured = _measured_bubble(p, m, cost_s, repeats)
            theory = pipeline.bubble_theory(p, m)
            worst = max(worst, abs(measured - theory) * 100)
            print(f"p={p} m={m}: measured bubble {measured:6.1%}, formula "
                  f"(p-1)/(m+p-1) {theory:6.1%}, "
                  f"gap {abs(measured - theory) * 100:4.1f} points")
    print(f"pipeline bubble max deviation: {worst:.1f} points")
    return worst
