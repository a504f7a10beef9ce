"""The fewest adapter loads any policy could make for ``bench.placement``'s requests.

The fleet's slots are a cache of adapters and every miss is a load, so cache
theory bounds what placement can save (issue 15's targets are relative to the
on-demand fleet, which already evicts by demand):

- **Best online** (no policy that does not know the future does better on
  independent Zipf draws): keep the ``slots`` most popular adapters, load every
  other request. Expected, from the popularity weights alone.
- **Belady** (knows every request ahead; no real policy can): on a miss with
  every slot taken, evict the adapter asked for again furthest in the future.
  Counted on the benchmark's own request plan.

Both ignore what only adds loads (one slot per worker rather than one pool,
extra copies for load, requests in flight pinning a slot), so a policy's
measured loads are at or above them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LoadBounds", "load_bounds"]


@dataclass(frozen=True, slots=True)
class LoadBounds:
    """Loads per minute no policy can go below, and what Belady leaves the tail."""

    best_online_per_min: float
    belady_per_min: float
    belady_tail_miss_share: float
    """Share of the tail adapters' requests that find no copy even under Belady: each
    waits at least one load time, so past 1% the tail's p99 is a load time or more."""


def load_bounds(
    ranks: Sequence[int], *, slots: int, adapters: int, tail_from: int, measured_from: int,
    measured_s: float,
) -> LoadBounds:  # fmt: skip
    """Bounds for the adapter requests ``ranks`` (base-model requests left out, negative).

    Requests before ``measured_from`` warm the cache and are not counted; the
    measured ones were sent over ``measured_s`` seconds.
    """
    weights = [1 / (rank + 1) for rank in range(adapters)]
    miss_share = 1 - sum(weights[:slots]) / sum(weights)
    measured = [rank for rank in ranks[measured_from:] if rank >= 0]
    misses, tail_misses = _belady_misses(ranks, slots, measured_from, tail_from)
    tail_requests = sum(rank >= tail_from for rank in measured)
    per_min = 60 / measured_s
    return LoadBounds(
        best_online_per_min=round(miss_share * len(measured) * per_min, 1),
        belady_per_min=round(misses * per_min, 1),
        belady_tail_miss_share=round(tail_misses / tail_requests, 4) if tail_requests else 0.0,
    )


def _belady_misses(
    ranks: Sequence[int], slots: int, measured_from: int, tail_from: int
) -> tuple[int, int]:
    """Misses (all, and of ranks from ``tail_from``) from ``measured_from`` on under Belady."""
    never = len(ranks)
    next_use = [never] * len(ranks)
    seen: dict[int, int] = {}
    for index in range(len(ranks) - 1, -1, -1):
        next_use[index] = seen.get(ranks[index], never)
        seen[ranks[index]] = index
    cache: dict[int, int] = {}  # adapter rank -> index of its next request
    misses = tail_misses = 0
    for index, rank in enumerate(ranks):
        if rank < 0:
            continue
        if rank not in cache:
            if index >= measured_from:
                misses += 1
                tail_misses += rank >= tail_from
            if len(cache) >= slots:
                del cache[max(cache, key=cache.__getitem__)]
        cache[rank] = next_use[index]
    return misses, tail_misses
