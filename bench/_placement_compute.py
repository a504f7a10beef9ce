"""How long one placement pass takes at fleet scale: ``proto.placement.plan_copies``, timed.

Issue 15's target is under 50 ms per change with 100 workers and 10,000 desired
adapters. The scenario is the heaviest a pass of that size can be: every
adapter wants a copy (so every adapter is planned), on instances with room for
all of them. Each change is timed as a worker meets it: the rendezvous cache
warm from the previous pass, the held copies those of the previous plan.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from bench._placement_plan import adapter_name
from bench._report import ms, percentile
from proto.placement import RendezvousCache, plan_copies

__all__ = ["time_placement"]

SLOT_HEADROOM: Final = 1.28
"""Slots per instance over the copies' fair share, so every copy fits under the load bound."""

Plan = dict[str, list[int]]


def _held(plan: Plan) -> dict[int, list[str]]:
    held: dict[int, list[str]] = {}
    for name, instances in plan.items():
        for instance in instances:
            held.setdefault(instance, []).append(name)
    return held


def _timed(
    copies: Mapping[str, int], slots: Mapping[int, int], plan: Plan, cache: RendezvousCache
) -> tuple[float, Plan]:
    started = time.perf_counter()
    new_plan = plan_copies(copies, slots, held=_held(plan), cache=cache)
    return time.perf_counter() - started, new_plan


def time_placement(workers: int, adapters: int, rounds: int) -> dict[str, Any]:
    """The first plan, then ``rounds`` x (an instance leaves, it returns, a copy added, dropped)."""
    per_instance = max(1, round(adapters / workers * SLOT_HEADROOM))
    slots = {instance: per_instance for instance in range(1, workers + 1)}
    copies = {adapter_name(rank): 1 for rank in range(adapters)}
    cache = RendezvousCache()
    started = time.perf_counter()
    plan = plan_copies(copies, slots, cache=cache)
    first_s = time.perf_counter() - started
    changes: list[float] = []
    for turn in range(rounds):
        leaving = turn % workers + 1
        without = {i: n for i, n in slots.items() if i != leaving}
        busier = {**copies, adapter_name(turn % adapters): 2}
        for step in (without, slots):
            seconds, plan = _timed(copies, step, plan, cache)
            changes.append(seconds)
        for wanted in (busier, copies):
            seconds, plan = _timed(wanted, slots, plan, cache)
            changes.append(seconds)
    return {
        "workers": workers, "adapters": adapters, "slots_per_worker": per_instance,
        "changes": len(changes), "first_plan_ms": ms(first_s),
        "change_p50_ms": ms(percentile(changes, 0.5)),
        "change_max_ms": ms(max(changes, default=None)),
    }  # fmt: skip
