"""How many copies of each adapter the fleet wants now: up at once with demand, down slowly.

Every worker computes this from the same fleet demand (the sum of the load
records), so they agree without a coordinator. A copy is added as soon as demand
per copy passes the prefetch threshold (``fleet.placement.wanted_copies``); one is
dropped only after demand stayed low enough for it (``may_drop_copy``) for the
whole cool-down, one copy per cool-down, so a dip does not unload a warm copy.
An adapter declared with no lower bound (``min_replicas: 0``) gets placed copies only
when demand wants two or more: its one copy is on-demand loading's, which puts it where
a request needs it and lets eviction rotate it. Placing that copy as well made placement
and on-demand loads fight over the same slots (``bench.placement``: 1.8x the loads of an
on-demand-only fleet).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from lorafleet.fleet.placement import may_drop_copy, wanted_copies

__all__ = ["CopyTargets"]


class CopyTargets:
    """Per-adapter copy counts between their bounds, with a cool-down before each drop.

    Example::

        targets = CopyTargets(copy_rps=10.0, cooldown_s=120.0)
        targets.target("pirate", low=1, high=4, demand_rps=15.0)  # 3: 15/s over 7/s per copy
    """

    def __init__(
        self,
        *,
        copy_rps: float,
        cooldown_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._copy_rps = copy_rps
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._current: dict[str, int] = {}
        self._low_since: dict[str, float] = {}
        """Adapter -> since when demand would allow one copy fewer."""

    def target(self, name: str, *, low: int, high: int, demand_rps: float) -> int:
        """The copies ``name`` should have now, given ``demand_rps`` across the fleet."""
        now = self._clock()
        up = max(low, min(high, wanted_copies(demand_rps, copy_rps=self._copy_rps)))
        current = max(low, min(high, self._current.get(name, up)))
        if up >= current:
            current = up
            self._low_since.pop(name, None)
        elif may_drop_copy(demand_rps, current, copy_rps=self._copy_rps):
            since = self._low_since.setdefault(name, now)
            if now - since >= self._cooldown_s:
                current -= 1
                self._low_since[name] = now
        else:
            self._low_since.pop(name, None)
        self._current[name] = current
        return 0 if low == 0 and current == 1 else current

    def next_drop_in_s(self) -> float | None:
        """Seconds until the earliest cool-down ends, None when none runs."""
        if not self._low_since:
            return None
        return max(0.0, min(self._low_since.values()) + self._cooldown_s - self._clock())

    def retain(self, names: Collection[str]) -> None:
        """Forget adapters not in ``names`` (deleted from the desired state)."""
        for table in (self._current, self._low_since):
            for name in [name for name in table if name not in names]:
                del table[name]
