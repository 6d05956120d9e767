"""Lab 01, section 4: is loading data the bottleneck? The speeds, the theory, a verdict.

Taught in: lab 01 (the fast path vs the DataLoader). The notebook times training fed
each way in blocks taken in turn (``labkit.bench.alternate``: both arms meet the same
load from other programs) and the DataLoader alone; ``compare`` turns those numbers
into the theory's range and a verdict that says what they show, including when they
contradict the expectation (another program's load, another machine).

The theory: one DataLoader worker decodes images while the model trains. With a core
to itself, a step takes the longer of the two, so the fast path gains
``max(1, train / loader)``; sharing the cores with the model, the worker's time adds
to every step: ``1 + train / loader``. ``train`` is the model's speed fed by the fast
path (its index gather costs next to nothing), ``loader`` the DataLoader's speed alone.
"""

import statistics
import time
from dataclasses import dataclass

from labkit.bench import Ratios
from labkit.messages import _

__all__ = ["endless", "batches_per_second", "images_per_second", "compare", "Comparison"]


def endless(make):
    """Yield batches forever from ``make()`` (a DataLoader or a fast-path pass)."""
    while True:
        yield from make()


def batches_per_second(batches, seconds: float) -> float:
    """Take batches from a started iterator for ``seconds``; return batches/s."""
    start = time.perf_counter()
    count = 0
    while True:
        images, _labels = next(batches)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    images.sum().item()  # make sure the last batch really exists
    return count / (time.perf_counter() - start)


def images_per_second(make_batches, seconds: float) -> float:
    """Images/s of loading alone, no training: batches for ``seconds`` after the first.

    The first batch is not timed: it pays for starting the DataLoader's worker.
    """
    batches = endless(make_batches)
    size = len(next(batches)[1])
    return size * batches_per_second(batches, seconds)


@dataclass(frozen=True)
class Comparison:
    """Training fed by the DataLoader and by the fast path, block by block, and why."""

    classic: tuple   # images/s of training per block, DataLoader
    fast: tuple      # the same, fast path
    loader: float    # images/s of the DataLoader alone

    @property
    def ratios(self) -> Ratios:
        return Ratios(tuple(f / c for f, c in zip(self.fast, self.classic)))

    @property
    def train(self) -> float:
        """The model's own speed: training fed by the fast path (median block)."""
        return statistics.median(self.fast)

    @property
    def theory(self) -> tuple[float, float]:
        """The gain the theory allows: (worker on a core of its own, cores shared)."""
        share = self.train / self.loader
        return max(1.0, share), 1.0 + share

    @property
    def theory_text(self) -> str:
        low, high = self.theory
        return f"{low:.1f}–{high:.1f}"

    def explain(self, device) -> None:
        """Print the blocks, the theory's inputs and a verdict drawn from the numbers."""
        blocks = ", ".join(f"{c:,.0f}/{f:,.0f}" for c, f in zip(self.classic, self.fast))
        print(_("Training images/s per pair of blocks (DataLoader/fast path): {blocks}."
                ).format(blocks=blocks))
        low, high = self.theory
        print(_("Theory: the worker alone loads {loader:,.0f} images/s and the model "
                "trains at {train:,.0f} images/s fed by the fast path, so the fast path "
                "gains {low:.1f}x if the worker has a core of its own (the slower of "
                "the two sets the pace) and {high:.1f}x if it shares the model's cores "
                "(its time adds to every step).").format(
                    loader=self.loader, train=self.train, low=low, high=high))
        print(self._verdict(low, high))
        print(self._elsewhere(device))

    def _verdict(self, low: float, high: float) -> str:
        ratios = self.ratios
        if ratios.within_noise:
            return _("Verdict: no clear difference here, now. Some pairs favour one "
                     "path and some the other ({low:.2f}x to {high:.2f}x), so other "
                     "work on this machine moved the speeds by more than loading "
                     "costs. Run the cell again on a quieter machine before quoting a "
                     "number.").format(low=ratios.low, high=ratios.high)
        if ratios.high < 1.0:
            return _("Verdict: the DataLoader was faster in every pair ({median:.2f}x),"
                     " which the theory does not allow: the fast path does strictly "
                     "less work. Something else changed between the blocks (another "
                     "program's load, the CPU's clock speed). Run the cell again."
                     ).format(median=ratios.median)
        # A quarter of slack either side: the speeds alone and the blocks were
        # measured at different moments of a machine whose load changes.
        if ratios.median < low / 1.25:
            why = _("below the theory's range: other programs slowed the blocks "
                    "unevenly, or the model's threads waited less for the worker "
                    "than the theory assumes")
        elif ratios.median > 1.25 * high:
            why = _("above the theory's range, which counts the decoding alone: "
                    "handing each batch from the worker to this process costs time "
                    "too, and the machine's load changed between the measurements")
        else:
            why = _("within the theory's range")
        return _("Verdict: the fast path trained {median:.1f}x as fast as the "
                 "DataLoader, {why}.").format(median=ratios.median, why=why)

    def _elsewhere(self, device) -> str:
        """Where the time went here, and (on a CPU) what a GPU would change."""
        low, _high = self.theory
        if self.loader < self.train:
            here = _("Here the model trains faster than one worker decodes, so it "
                     "waits for the worker: loading is this device's bottleneck, and "
                     "keeping the data on the device removes it.")
        elif self.ratios.low > 1.0 and self.ratios.median > 1.1 * low:
            here = _("One worker decodes faster than the model trains, so the model "
                     "never waits for a batch; what the fast path saved here is the CPU "
                     "time the worker's decoding took from the model's cores (none was "
                     "free). With a core to spare the gain shrinks towards "
                     "{low:.1f}x.").format(low=low)
        else:
            here = _("One worker decodes faster than the model trains, and it had a "
                     "core to spare: loading cost this device next to nothing.")
        if getattr(device, "type", device) == "cuda":
            return here
        return here + " " + _(
            "A GPU trains a model this small far faster than two CPU cores while the "
            "worker decodes no faster: there the GPU would wait for the DataLoader, and "
            "the fast path's gain approaches the GPU's training speed divided by "
            "{loader:,.0f} images/s.").format(loader=self.loader)


def compare(classic, fast, loader: float) -> Comparison:
    """Pair the blocks' images/s (DataLoader, fast path) with the loader's own speed."""
    if not classic or len(classic) != len(fast):
        raise ValueError(_("compare needs as many DataLoader blocks as fast-path "
                           "blocks, at least one; got {classic} and {fast}.").format(
                               classic=len(classic), fast=len(fast)))
    return Comparison(tuple(classic), tuple(fast), float(loader))
