"""Per-adapter request rates on this worker, as exponentially decayed counters.

The fleet's demand signal: each worker counts the requests it serves and
publishes the rates in its load record (``worker.load_report``); placement and
eviction sum them over the fleet. A request adds ``ln 2 / half-life`` to its
adapter's counter, which halves every half-life, so a steady rate of r requests/s
reads r. Counters below ``MIN_RATE_RPS`` are dropped: idle adapters leave the record.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final

__all__ = ["DEMAND_HALF_LIFE_S", "DemandMeter"]

DEMAND_HALF_LIFE_S: Final = 30.0
"""Default half-life of the counters (``--lora-demand-half-life-s``)."""
MIN_RATE_RPS: Final = 0.001
"""Rates below this read as no demand (about one request per 17 minutes)."""
RATE_DECIMALS: Final = 3
"""Rates are rounded to this many decimals in the record (finer is noise)."""


class DemandMeter:
    """Decayed request counters by adapter name.

    Example::

        meter = DemandMeter(half_life_s=30.0)
        meter.record("pirate")
        meter.rates()  # {"pirate": 0.023}
    """

    def __init__(
        self,
        *,
        half_life_s: float = DEMAND_HALF_LIFE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not half_life_s > 0:
            raise ValueError(f"demand half-life must be positive, got {half_life_s}")
        self._decay_per_s = math.log(2) / half_life_s
        self._clock = clock
        self._counters: dict[str, tuple[float, float]] = {}
        """Adapter -> (rate at the time, the time)."""

    def record(self, name: str) -> None:
        """Count one request for ``name`` now."""
        now = self._clock()
        self._counters[name] = (self._rate_at(name, now) + self._decay_per_s, now)

    def rate(self, name: str) -> float:
        """``name``'s recent requests per second (0 when idle)."""
        return self._rate_at(name, self._clock())

    def rates(self) -> dict[str, float]:
        """Every adapter's recent requests per second, rounded; idle adapters are dropped."""
        now = self._clock()
        rates = {name: self._rate_at(name, now) for name in self._counters}
        for name in [name for name, rate in rates.items() if rate < MIN_RATE_RPS]:
            del self._counters[name], rates[name]
        return {name: round(rate, RATE_DECIMALS) for name, rate in sorted(rates.items())}

    def _rate_at(self, name: str, now: float) -> float:
        rate, at = self._counters.get(name, (0.0, now))
        return rate * math.exp(-self._decay_per_s * (now - at))
