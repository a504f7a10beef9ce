"""Copies from demand: up at once, down one per cool-down; with a hand-driven clock."""

from __future__ import annotations

from lorafleet.worker.copy_targets import CopyTargets
from tests.hand_clock import HandClock


def test_an_extra_copy_goes_only_after_the_cooldown() -> None:
    clock = HandClock()
    targets = CopyTargets(copy_rps=10.0, cooldown_s=60.0, clock=clock)
    assert targets.target("a", low=1, high=3, demand_rps=15.0) == 3  # 15/s over 7/s per copy
    assert targets.target("a", low=1, high=3, demand_rps=12.0) == 3  # 12/2 > 5: keep all
    assert targets.target("a", low=1, high=3, demand_rps=4.0) == 3  # low, cool-down starts
    clock.now += 59.0
    assert targets.target("a", low=1, high=3, demand_rps=4.0) == 3
    clock.now += 1.0
    assert targets.target("a", low=1, high=3, demand_rps=4.0) == 2  # one copy per cool-down
    clock.now += 60.0
    assert targets.target("a", low=1, high=3, demand_rps=4.0) == 1
    assert targets.target("a", low=2, high=3, demand_rps=0.0) == 2  # never below the bound


def test_an_on_demand_adapter_gets_placed_copies_only_beyond_its_first() -> None:
    """``min_replicas: 0``: one copy is on-demand loading's; placement adds the second."""
    clock = HandClock()
    targets = CopyTargets(copy_rps=10.0, cooldown_s=60.0, clock=clock)
    assert targets.target("a", low=0, high=2, demand_rps=3.0) == 0  # one copy serves it
    assert targets.target("a", low=0, high=2, demand_rps=8.0) == 2  # past 7/s: a second
    clock.now += 60.0
    assert targets.target("a", low=0, high=2, demand_rps=3.0) == 2  # cool-down starts
    clock.now += 60.0
    assert targets.target("a", low=0, high=2, demand_rps=3.0) == 0  # back to on demand
    assert targets.target("b", low=1, high=2, demand_rps=3.0) == 1  # a lower bound is placed
