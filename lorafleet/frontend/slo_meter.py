"""Count this frontend's answered requests to adapters with latency targets, by window.

A request answered (200) with a first token counts in its adapter's window: its TTFT,
its inter-token latency (the time from the first token to the last over the tokens
after the first, for two tokens or more) and whether each is within the adapter's
target. Windows are ``window_s`` long and start at multiples of it in Unix time, the
same on every frontend, so their counts add up (``frontend.slo_loop`` publishes them).
Errors are not latencies: they count in the error metrics, not here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from lorafleet.frontend.desired_state import DesiredState
from lorafleet.proto.slo import SloCounts, SloTargets, bucket_of

__all__ = ["SloMeter"]


class SloMeter:
    """Per-window counts of the adapters whose desired state has ``slo`` targets.

    Example::

        meter = SloMeter(desired, window_s=10.0)
        meter.observe("pirate", ttft_s=0.2, itl_s=0.02)
        meter.take_before(meter.window_now())  # {window: {"pirate": SloCounts(...)}}
    """

    def __init__(
        self, desired: DesiredState, *, window_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._desired = desired
        self.window_s = window_s
        self._clock = clock
        self._targets: dict[str, SloTargets] = {}
        self._windows: dict[int, dict[str, SloCounts]] = {}
        desired.cache.subscribe(lambda *_: self._follow_targets())
        self._follow_targets()

    def _follow_targets(self) -> None:
        """Keep the targets by name: ``observe`` costs one dict look-up per request."""
        self._targets = {
            spec.name: spec.slo
            for spec in self._desired.cache.items.values()
            if spec.slo is not None and (spec.slo.ttft_p95_ms or spec.slo.itl_p95_ms)
        }

    def targets(self) -> dict[str, SloTargets]:
        """Adapter -> its targets, for every adapter that has one."""
        return self._targets

    def window_now(self) -> int:
        """The index of the window running now."""
        return math.floor(self._clock() / self.window_s)

    def observe(self, name: str, *, ttft_s: float, itl_s: float | None) -> None:
        """Count one answered request to ``name`` (nothing when it has no targets)."""
        targets = self._targets.get(name)
        if targets is None:
            return
        window = self._windows.setdefault(self.window_now(), {})
        counts = window.get(name)
        if counts is None:
            counts = window[name] = SloCounts()
        ttft_ms = ttft_s * 1000
        ttft_ok = targets.ttft_p95_ms is None or ttft_ms <= targets.ttft_p95_ms
        counts.requests += 1
        counts.ttft_met += ttft_ok
        _count(counts.ttft_buckets, ttft_ms)
        itl_ok = True
        if itl_s is not None:
            itl_ms = itl_s * 1000
            itl_ok = targets.itl_p95_ms is None or itl_ms <= targets.itl_p95_ms
            counts.itl_requests += 1
            counts.itl_met += itl_ok
            _count(counts.itl_buckets, itl_ms)
        counts.met += ttft_ok and itl_ok

    def take_before(self, window: int) -> dict[int, dict[str, SloCounts]]:
        """Remove and return the counts of every window before ``window`` (they ended)."""
        ended = {index: counts for index, counts in self._windows.items() if index < window}
        for index in ended:
            del self._windows[index]
        return ended


def _count(buckets: dict[int, int], ms: float) -> None:
    bucket = bucket_of(ms)
    buckets[bucket] = buckets.get(bucket, 0) + 1
