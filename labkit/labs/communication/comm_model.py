"""The cost of communication as a model: bus bandwidth, the alpha-beta fit, and what
it predicts for a DDP step.

Taught in: lab 06 (communication: measure it, model it, shrink it); ``labkit bench
allreduce`` prints the same table and fit. Units, as everywhere in the course: bytes,
seconds, bandwidth in GB/s (10**9 bytes per second).

The model: one all-reduce of ``n`` bytes takes ``t = alpha + n / beta``: a fixed
latency (``alpha``: start-up, synchronisation, per-message software cost) plus the
bytes over an effective bandwidth (``beta``). nccl-tests reports ``algbw = n / t`` and
``busbw = algbw * 2(N-1)/N``: a ring all-reduce moves 2(N-1)/N of the bytes over each
link, so busbw is comparable with the link's own speed whatever N is.

Two latency models meet in the course. Lab 00's ring charges a latency per ring
*step*, ``2(N-1) alpha_step``; here ``alpha`` is fitted to whole collective calls as
they are measured, so it is one latency per *call* (all steps, the library's
set-up and synchronisation included): ``alpha_call ~ 2(N-1) alpha_step`` on a ring of
N ranks. A fit at one N does not say how alpha grows with N (NCCL's trees grow it
with log N, not N).
"""

import math
import time
import unicodedata
from dataclasses import dataclass

import numpy as np
import torch

from labkit.messages import _

__all__ = ["bus_factor", "AlphaBeta", "fit_alpha_beta", "table", "plot_fit",
           "memcpy_gbytes_per_s", "ring_seconds", "ddp_step"]


def bus_factor(world_size: int) -> float:
    """Return 2(N-1)/N: busbw / algbw for an all-reduce on ``world_size`` ranks."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) \
            or world_size < 1:
        raise ValueError(_("world_size must be a positive integer, got "
                           "{world_size!r}.").format(world_size=world_size))
    return 2 * (world_size - 1) / world_size


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted all-reduce cost: ``alpha`` seconds plus bytes / ``beta`` (bytes/s)."""

    alpha: float
    beta: float

    def seconds(self, n_bytes) -> float:
        """Return the predicted seconds to all-reduce ``n_bytes``."""
        return self.alpha + n_bytes / self.beta

    @property
    def half_bytes(self) -> float:
        """Message size at which latency and bandwidth cost the same (alpha * beta)."""
        return self.alpha * self.beta

    def __str__(self) -> str:
        return _("alpha = {alpha_us:.1f} us, beta = {beta_gbytes_per_s:.3f} GB/s "
                 "(latency and bandwidth cost the same at {half_kb:.1f} kB)").format(
                     alpha_us=self.alpha * 1e6, beta_gbytes_per_s=self.beta / 1e9,
                     half_kb=self.half_bytes / 1e3)


def fit_alpha_beta(times: dict) -> AlphaBeta:
    """Fit ``t = alpha + n / beta`` to ``{n_bytes: seconds}``; return the fit.

    Least squares on the *relative* error: the sizes span seven orders of magnitude,
    and an absolute fit would let the largest message decide everything.
    """
    sizes = np.array(sorted(times), dtype=float)
    seconds = np.array([times[n] for n in sorted(times)], dtype=float)
    if len(sizes) < 2 or (seconds <= 0).any() or (sizes <= 0).any():
        raise ValueError(_("Need at least 2 sizes with positive times to fit alpha and "
                           "beta, got {times!r}.").format(times=dict(times)))
    design = np.stack([np.ones_like(sizes), sizes], axis=1) / seconds[:, None]
    (alpha, per_byte), *_rest = np.linalg.lstsq(design, np.ones_like(sizes),
                                                rcond=None)
    # Noise can push one term below zero; a cost is never negative.
    alpha = max(float(alpha), 1e-9)
    per_byte = max(float(per_byte), 1e-15)
    return AlphaBeta(alpha, 1.0 / per_byte)


def _rjust(text: str, width: int) -> str:
    """``text`` right-aligned in ``width`` columns of a terminal (a CJK character is
    two)."""
    used = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    return " " * max(width - used, 0) + text


def _size(n_bytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:g} {unit}"
    return f"{n_bytes} B"


def table(times: dict, world_size: int, fit: AlphaBeta | None = None) -> list[dict]:
    """Print ``{n_bytes: seconds}`` the way nccl-tests does; return the rows.

    Each row: size (bytes), time (us), algbw and busbw (GB/s), and the fit's
    prediction (us) when ``fit`` is given.
    """
    factor = bus_factor(world_size)
    rows = []
    header = [_rjust(_("size"), 10), _rjust(_("bytes"), 12), _rjust(_("time (us)"), 11),
              f"{'algbw GB/s':>11}", f"{'busbw GB/s':>11}"]
    print(" ".join(header + ([_rjust(_("fit (us)"), 10)] if fit else [])))
    for n_bytes in sorted(times):
        seconds = times[n_bytes]
        algbw = n_bytes / seconds / 1e9
        row = {"bytes": n_bytes, "us": seconds * 1e6, "algbw": algbw,
               "busbw": algbw * factor}
        line = (f"{_size(n_bytes):>10} {n_bytes:>12,} {row['us']:>11.1f} "
                f"{algbw:>11.4f} {row['busbw']:>11.4f}")
        if fit:
            row["fit_us"] = fit.seconds(n_bytes) * 1e6
            line += f" {row['fit_us']:>10.1f}"
        print(line)
        rows.append(row)
    return rows


def plot_fit(times: dict, fit: AlphaBeta, world_size: int, ax=None,
             references: dict | None = None, title: str | None = None):
    """Draw measured times and the alpha-beta fit on log-log axes; return the Axes.

    ``references`` maps a label to a bandwidth in GB/s (memcpy, NVLink, ...): each
    is drawn as the time a pure-bandwidth all-reduce of each size would take on it
    (bytes * 2(N-1)/N / bandwidth), so the measured line can be read against them.
    """
    import matplotlib.pyplot as plt

    from labkit.timeline import use_cjk_font

    use_cjk_font()
    if ax is None:
        _fig, ax = plt.subplots(figsize=(7, 4))
    sizes = np.array(sorted(times), dtype=float)
    measured = np.array([times[int(n)] for n in sizes])
    grid = np.logspace(math.log10(sizes[0]), math.log10(sizes[-1]), 100)
    ax.loglog(sizes, measured * 1e6, "o", label=_("measured"))
    ax.loglog(grid, fit.seconds(grid) * 1e6, "-",
              label=_("fit: {alpha_us:.0f} us + n / {beta_gbytes_per_s:.2f} GB/s"
                      ).format(alpha_us=fit.alpha * 1e6,
                               beta_gbytes_per_s=fit.beta / 1e9))
    ax.axhline(fit.alpha * 1e6, color="grey", ls=":", lw=1,
               label=_("alpha (latency)"))
    for label, gbytes in (references or {}).items():
        ax.loglog(grid, grid * bus_factor(world_size) / (gbytes * 1e9) * 1e6, "--",
                  lw=1, label=_("{link}: busbw {gbytes_per_s:g} GB/s, no latency"
                                ).format(link=label, gbytes_per_s=gbytes))
    ax.set(xlabel=_("message size (bytes)"), ylabel=_("all-reduce time (us)"),
           title=title or _("all-reduce on {world_size} ranks").format(
               world_size=world_size))
    ax.legend(fontsize=8)
    return ax


def memcpy_gbytes_per_s(n_bytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Time copying ``n_bytes`` from one CPU buffer to another; return GB/s.

    The fastest 'link' any machine has: gloo on loopback moves the same bytes through
    the kernel's TCP stack, several copies each way.
    """
    source = torch.empty(n_bytes, dtype=torch.uint8)
    target = torch.empty_like(source)
    target.copy_(source)   # warm-up: the pages are touched once
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return n_bytes / best / 1e9


def ring_seconds(n_bytes: float, world_size: int, link_gbytes_per_s: float,
                 alpha: float = 0.0, messages: int = 1) -> float:
    """Return a ring all-reduce's time on a link: ``messages`` latencies + bytes.

    Each rank sends 2(N-1)/N of ``n_bytes`` over its link (``link_gbytes_per_s``:
    what the link achieves for an all-reduce, e.g. nccl-tests' busbw, not its line
    rate); ``alpha`` is one whole all-reduce call's latency, as fitted (DDP makes one
    call per bucket), not one ring step's.
    """
    if link_gbytes_per_s <= 0:
        raise ValueError(_("link bandwidth must be positive, got {bandwidth}.").format(
            bandwidth=link_gbytes_per_s))
    if world_size == 1:
        return 0.0
    per_rank = n_bytes * bus_factor(world_size)
    return messages * alpha + per_rank / (link_gbytes_per_s * 1e9)


def ddp_step(compute_s: float, allreduce_s: float, world_size: int,
             overlap: float = 0.0) -> dict:
    """Predict a data-parallel step, each rank keeping its own batch (weak scaling).

    ``compute_s``: one rank's forward + backward + optimizer on its batch;
    ``allreduce_s``: the gradient all-reduce; ``overlap``: the share of it hidden
    behind backward (0: none, DDP on GPUs hides much of it). Returns the step time,
    the speedup over one device and the scaling efficiency (speedup / N).
    """
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(_("overlap is a share between 0 and 1, got {overlap}.").format(
            overlap=overlap))
    exposed = allreduce_s * (1.0 - overlap) if world_size > 1 else 0.0
    step = compute_s + exposed
    speedup = world_size * compute_s / step
    return {"step_s": step, "speedup": speedup, "efficiency": speedup / world_size}
