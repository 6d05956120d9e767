"""What the benchmarks share: alternate two arms, summarize their ratio (no torch here).

Taught in: the benchmarks behind labs 01, 03 and 05 (each in its lab's room;
``labkit.labs.BENCHMARKS`` names them, ``labkit bench NAME`` runs one).

One run of A then one of B gives a ratio that other programs on the machine can move
by more than the effect measured. So each benchmark runs A, B, A, B, ... and takes
one ratio per adjacent pair (the two arms of a pair share the machine's state), then
reports the median with its range. The last line carries both, e.g.
``fast path vs DataLoader: 96x (71–112x over 7 pairs)``. When the range is wider than
the effect (the distance of the median from "no difference") it says so: "within the
noise" when pairs fall on both sides of "no difference", else "spread wider than the
effect" (the direction holds, the size does not).
"""

import statistics
from dataclasses import dataclass

__all__ = ["alternate", "Ratios"]


def alternate(arm_a, arm_b, pairs: int) -> tuple[list, list]:
    """Call ``arm_a()``, ``arm_b()``, ``arm_a()``, ... ``pairs`` times each; return both."""
    a, b = [], []
    for _ in range(pairs):
        a.append(arm_a())
        b.append(arm_b())
    return a, b


@dataclass(frozen=True)
class Ratios:
    """One ratio per pair; ``null`` is the value meaning "no difference"."""

    values: tuple
    null: float = 1.0
    unit: str = "x"
    digits: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def effect(self) -> float:
        """How far the median is from "no difference"."""
        return abs(self.median - self.null)

    @property
    def spread(self) -> float:
        return self.high - self.low

    @property
    def wide(self) -> bool:
        """Is the range of the pairs wider than the effect itself?"""
        return self.spread > self.effect

    @property
    def within_noise(self) -> bool:
        """Do the pairs disagree even on the direction (the range holds the null)?"""
        return self.low <= self.null <= self.high

    def _number(self, value: float) -> str:
        return f"{value:.{self.digits}f}"

    def noise_note(self, what: str) -> str | None:
        """Explain, when the spread is wider than the effect, what that means."""
        if not self.wide:
            return None
        n, unit = self._number, self.unit
        spread = (f"Note: the pairs spread over {n(self.spread)}{unit}, more than the "
                  f"effect ({n(self.effect)}{unit} from {n(self.null)}{unit}, {what})")
        if self.within_noise:
            return (f"{spread}, and some pairs fall on each side of {n(self.null)}"
                    f"{unit}: on this machine, now, the difference is within the noise. "
                    "Run it again on a quieter machine before quoting it.")
        return (f"{spread}. Every pair agrees on the direction, not on the size: "
                "quote the range, not the median.")

    def headline(self, label: str) -> str:
        """The last line: median, range and number of pairs (and how far to trust it)."""
        n = self._number
        trust = ("; within the noise" if self.within_noise
                 else "; spread wider than the effect" if self.wide else "")
        return (f"{label}: {n(self.median)}{self.unit} ({n(self.low)}–{n(self.high)}"
                f"{self.unit} over {len(self.values)} pairs{trust})")
