"""``labkit bench allreduce``: all-reduce time, algbw and busbw from 4 B to 64 MiB, the
way nccl-tests reports them, and the alpha-beta fit.

Taught in: lab 06 (the learner writes ``time_allreduce``; this is labkit's copy, and
a test checks the two agree). NCCL with one GPU per rank when there are 2 GPUs or
more, else 2 gloo CPU ranks. Last line: ``allreduce busbw at 64 MB: <GB/s>`` (64 MB
as nccl-tests counts it: 64 MiB = 67,108,864 bytes).

``labkit bench allreduce --link 1gbe`` (root only: ``labkit.cluster``) runs the 2
ranks on two network-namespace nodes joined by a link shaped to the profile, and
fits alpha and beta there. Last line: the link's beta (sizes from 1 MiB, each
size's best call) vs the shaped rate, with the tolerance ``LINK_TOLERANCE`` (10 %)
measured on this course's 2-core machine: on 1gbe, 13 runs at a load of 3-8 gave
-4.4 % ... -8.0 % (TCP/IP headers alone take 4.4 % of the rate). The lab's fit over
every size is printed too: tbf's 256 KiB token bucket lets mid-size messages out
faster than the rate, which moved its beta from -14 % to +10 % in 17 runs. Alpha is
not shaped where the kernel has no netem (that VM's).
"""

import statistics
import time

import torch
import torch.distributed as dist

from labkit import hardware, launch
from labkit.labs.communication import comm_model
from labkit.messages import _   # what allreduce_on_link prints reaches lab 06

__all__ = ["time_allreduce", "sizes_up_to", "allreduce", "allreduce_on_link",
           "LINK_TOLERANCE"]

HEADLINE_BYTES = 64 * 2**20
# |fitted beta / shaped rate - 1| allowed on a shaped link: measured, see above.
LINK_TOLERANCE = 0.10
BANDWIDTH_FROM = 2**20     # 4 x labkit.cluster.BURST: the link's beta from here on
# On the wire a full TCP segment is 1514 bytes (Ethernet 14, IP 20, TCP 32 with
# timestamps) carrying 1448 of payload: tbf counts every byte of it.
PAYLOAD_SHARE = 1448 / 1514


def _synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_allreduce(ctx, sizes, iters: int = 10, warmup: int = 3) -> dict:
    """Return ``{n_bytes: median seconds}`` of all-reducing a float32 tensor per size.

    For each size: ``warmup`` untimed calls (connections, buffers, NCCL's first-call
    set-up), a barrier so every rank starts the clock together, then ``iters`` timed
    calls, each waited for (on GPUs: synchronize) before the clock stops.
    """
    times = {}
    for n_bytes in sizes:
        tensor = torch.ones(max(1, n_bytes // 4), device=ctx.device)   # 4 B per float
        for _ in range(warmup):
            dist.all_reduce(tensor)
        _synchronize(ctx.device)
        dist.barrier()
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            dist.all_reduce(tensor)
            _synchronize(ctx.device)
            samples.append(time.perf_counter() - start)
        times[n_bytes] = statistics.median(samples)
    return times


def sizes_up_to(max_bytes: int, min_bytes: int = 4, factor: int = 4) -> list[int]:
    """Return ``min_bytes``, x factor, ... up to ``max_bytes`` (4 B to 64 MiB: 13)."""
    sizes, n_bytes = [], min_bytes
    while n_bytes <= max_bytes:
        sizes.append(n_bytes)
        n_bytes *= factor
    return sizes


def _measure(world_size: int, backend: str, sizes: list[int]) -> dict:
    """Time small sizes with many iterations and large ones with few (two launches)."""
    small = [n for n in sizes if n < 2**22]
    large = [n for n in sizes if n >= 2**22]
    times = {}
    for group, iters in ((small, 20), (large, 5)):
        if group:
            ranks = launch.run(time_allreduce, world_size, args=(group, iters, 3),
                               backend=backend, timeout=300)
            # The slowest rank decides when a collective is done everywhere.
            times.update({n: max(r[n] for r in ranks) for n in group})
    return times


def _samples(ctx, groups) -> dict:
    """Rank worker: every timed call's seconds, ``{n_bytes: [s, ...]}``.

    ``groups``: (sizes, iterations) pairs; per size, as ``time_allreduce``: 3 untimed
    calls, a barrier, then each call timed on its own.
    """
    found = {}
    for sizes, iters in groups:
        for n_bytes in sizes:
            tensor = torch.ones(max(1, n_bytes // 4), device=ctx.device)
            for _ in range(3):
                dist.all_reduce(tensor)
            _synchronize(ctx.device)
            dist.barrier()
            found[n_bytes] = []
            for _ in range(iters):
                start = time.perf_counter()
                dist.all_reduce(tensor)
                _synchronize(ctx.device)
                found[n_bytes].append(time.perf_counter() - start)
    return found


def allreduce_on_link(profile="1gbe", max_bytes: int = HEADLINE_BYTES, rate=None,
                      delay=None) -> dict:
    """Time all-reduce between 2 nodes on a shaped link; fit alpha-beta; say how close.

    One gloo rank in each of two network-namespace nodes (``labkit.cluster``: needs
    root), the link shaped to ``profile`` (``rate``/``delay`` override it). Two fits:
    the lab's (every size, medians), whose alpha is the latency; and the link's beta,
    fitted to the sizes from ``BANDWIDTH_FROM`` on (4 x tbf's token bucket: smaller
    messages leave faster than the rate) with each size's best call (a loaded CPU only
    ever slows a transfer down). Returns the times, both fits, the shaped rate
    (bytes/s), beta's relative error and whether it is within ``LINK_TOLERANCE``.
    The last line printed says it.
    """
    from labkit import cluster

    reason = cluster.unavailable()
    if reason:
        raise RuntimeError(f"--link {reason}.")
    sizes = sizes_up_to(max_bytes)
    groups = [(g, iters) for g, iters in (([n for n in sizes if n < 2**22], 20),
                                          ([n for n in sizes if n >= 2**22], 5)) if g]
    with cluster.Cluster(2, profile, rate, delay, verbose=False) as box:
        shaped = box.link
        print(_("all-reduce of float32 tensors, 4 B to {max_bytes:,} B, 2 gloo ranks "
                "on 2 nodes ({cluster}); 20 timed calls per size (5 from 4 MiB), after "
                "3 warm-up calls and a barrier.").format(max_bytes=max_bytes,
                                                          cluster=box.describe()))
        ranks = box.launch(_samples, args=(groups,), timeout=300)
        delay_shaped = box.delay_shaped
    # The slowest rank decides when a collective is done everywhere.
    times = {n: max(statistics.median(r[n]) for r in ranks) for n in sizes}
    best = {n: max(min(r[n]) for r in ranks) for n in sizes}
    fit = comm_model.fit_alpha_beta(times)
    comm_model.table(times, 2, fit)
    print(_("alpha-beta fit (every size, medians): {fit}").format(fit=fit))
    large = [n for n in sizes if n >= BANDWIDTH_FROM]
    large = large if len(large) >= 2 else sizes[-2:]
    link_fit = comm_model.fit_alpha_beta({n: best[n] for n in large})
    print(_("the link's beta, from {size:,} B on (best calls): {gbytes:.4f} GB/s")
          .format(size=large[0], gbytes=link_fit.beta / 1e9))
    report = {"times": times, "best": best, "fit": fit, "link_fit": link_fit,
              "profile": shaped.name, "shaped_bytes_per_s": shaped.bytes_per_s,
              "delay_s": shaped.delay_s, "delay_shaped": delay_shaped, "error": None,
              "within": None, "tolerance": LINK_TOLERANCE}
    if shaped.bytes_per_s is None:
        beta = _("beta {gbytes:.3f} GB/s (rate not shaped)").format(
            gbytes=link_fit.beta / 1e9)
    else:
        error = link_fit.beta / shaped.bytes_per_s - 1
        report.update(error=error, within=abs(error) <= LINK_TOLERANCE)
        print(_("TCP/IP headers take {share:.1%} of the shaped rate: the payload can "
                "reach {gbytes:.3f} GB/s.").format(
                    share=1 - PAYLOAD_SHARE,
                    gbytes=shaped.bytes_per_s * PAYLOAD_SHARE / 1e9))
        if error < -LINK_TOLERANCE:
            print(_("beta is well below the shaped rate: this machine's gloo cannot "
                    "fill the link (`labkit bench allreduce` without --link measures "
                    "what it can); the CPUs, not the link, are the limit."))
        beta = _("beta {gbytes:.3f} GB/s vs shaped {shaped:.3f} GB/s ({error:+.1%}, "
                 "tolerance ±{tolerance:.0%})").format(
                     gbytes=link_fit.beta / 1e9, shaped=shaped.bytes_per_s / 1e9,
                     error=error, tolerance=LINK_TOLERANCE)
    if delay_shaped:
        alpha = _("alpha {alpha_us:.0f} us, the link adds 2 x {delay_us:g} us "
                  "(2 ranks: 2 one-way hops)").format(alpha_us=fit.alpha * 1e6,
                                            delay_us=shaped.delay_s * 1e6)
    elif shaped.delay_s:
        alpha = _("alpha {alpha_us:.0f} us (no delay shaped: no netem in this kernel; "
                  "gloo's and the CPUs' own latency)").format(alpha_us=fit.alpha * 1e6)
    else:
        alpha = _("alpha {alpha_us:.0f} us (no delay shaped; gloo's and the CPUs' own "
                  "latency)").format(alpha_us=fit.alpha * 1e6)
    print(_("allreduce on {link}: {beta}; {alpha}").format(link=shaped.name, beta=beta,
                                                           alpha=alpha))
    return report


def allreduce(max_bytes: int = HEADLINE_BYTES, link=None):
    """Measure all-reduce from 4 B to ``max_bytes``; print the table; return busbw.

    The returned figure is busbw (GB/s) at the largest size. With ``link`` (a
    profile of ``labkit.cluster``: 1gbe, 10gbe, 25gbe, lowlat), the 2 ranks run on
    two nodes over that shaped link instead: see ``allreduce_on_link`` (it returns
    its report).
    """
    if link is not None:
        return allreduce_on_link(link, max_bytes)
    gpus = torch.cuda.device_count()
    world_size = gpus if gpus >= 2 else 2
    backend = "nccl" if gpus >= 2 else "gloo"
    setup = hardware.choose(world_size, backend, verbose=False)
    print(f"all-reduce of float32 tensors, 4 B to {max_bytes:,} B, {world_size} ranks, "
          f"{setup.backend} on {setup.device_type} ({setup.reason}); median of 20 "
          "iterations (5 from 4 MiB), after 3 warm-up calls and a barrier.")
    times = _measure(world_size, backend, sizes_up_to(max_bytes))
    fit = comm_model.fit_alpha_beta(times)
    rows = comm_model.table(times, world_size, fit)
    print(f"alpha-beta fit: {fit}")
    if setup.device_type == "cpu":
        memcpy = comm_model.memcpy_gbytes_per_s()
        print(f"loopback memcpy (one thread, 64 MiB): {memcpy:.2f} GB/s; busbw reached "
              f"{rows[-1]['busbw'] / memcpy:.0%} of it (gloo goes through TCP).")
    else:
        print("For comparison (lab 00): NVLink 4 450 GB/s each way, PCIe 5 x16 ~63 "
              "GB/s, InfiniBand NDR 50 GB/s per port.")
    busbw = rows[-1]["busbw"]
    label = "64 MB" if max_bytes == HEADLINE_BYTES else f"{max_bytes:,} B"
    print(f"allreduce busbw at {label}: {busbw:.2f} GB/s")
    return busbw
