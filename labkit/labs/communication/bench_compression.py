"""``labkit bench compression``: DDP communication hooks side by side on 2 ranks.

Taught in: lab 06 section 3. Trains the MLP 784-512-512-10 on MNIST with the plain
all-reduce hook, fp16, bf16 and PowerSGD (rank 1, 2 and 4, plain all-reduce for the
first 10 % of the steps); prints bytes per step, step time here and on an emulated
1 Gbit/s link, and test accuracy. Last line: ``powersgd bytes vs plain all-reduce:
<ratio>x`` (rank 1, the steady state after the warm-up).
"""

from labkit import launch
from labkit.labs.communication import compression

__all__ = ["compression_benchmark"]

SPECS = ["allreduce", "fp16", "bf16", "powersgd-1", "powersgd-2", "powersgd-4"]


def compression_benchmark(steps: int = 300, width: int = 512,
                          limit: int | None = 20000) -> float:
    """Train once per hook, same budget; print the table; return PowerSGD-1's ratio."""
    cfg = compression.CompressionConfig(steps=steps, width=width, limit=limit,
                                        powersgd_start=max(2, steps // 10))
    print(f"MLP 784-{width}-{width}-10 on {limit or 60000} MNIST images, 2 DDP ranks "
          f"(NCCL with 2+ GPUs, else gloo), {steps} steps of {cfg.batch_per_rank} per "
          f"rank, SGD momentum {cfg.momentum}; PowerSGD starts at step "
          f"{cfg.powersgd_start}; slow link emulated at {cfg.slow_link_gbytes_per_s} "
          "GB/s (1 Gbit/s).")
    results = launch.run(compression.train_variants, 2, args=(cfg, SPECS),
                         timeout=600)[0]
    plain = results[0]
    print(f"{'hook':<12}{'bytes/step':>12}{'fewer':>8}{'ms/step':>9}{'1 Gbit/s ms':>13}"
          f"{'accuracy':>10}")
    for r in results:
        print(f"{r['name']:<12}{r['bytes_per_step']:>12,}"
              f"{plain['bytes_per_step'] / r['bytes_per_step']:>7.0f}x"
              f"{r['ms_per_step']:>9.1f}{r['slow_link_ms']:>13.1f}"
              f"{r['accuracy']:>10.2%}")
    powersgd = next(r for r in results if r["name"] == "powersgd-1")
    ratio = plain["bytes_per_step"] / powersgd["bytes_per_step"]
    print(f"powersgd accuracy vs plain all-reduce: "
          f"{100 * (powersgd['accuracy'] - plain['accuracy']):+.1f} points")
    print(f"powersgd bytes vs plain all-reduce: {ratio:.0f}x")
    return ratio
