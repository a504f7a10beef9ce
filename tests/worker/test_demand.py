"""Decayed request counters, with a hand-driven clock."""

from __future__ import annotations

from lorafleet.worker.demand import DemandMeter
from tests.hand_clock import HandClock


def test_demand_reads_the_rate_and_decays_by_half_each_half_life() -> None:
    clock = HandClock()
    meter = DemandMeter(half_life_s=10.0, clock=clock)
    for _ in range(100):  # 2 requests per second for 50 s
        meter.record("pirate")
        clock.now += 0.5
    assert 1.6 < meter.rate("pirate") < 2.1
    before = meter.rate("pirate")
    clock.now += 10.0
    assert abs(meter.rate("pirate") - before / 2) < 1e-6
    clock.now += 1000.0
    assert meter.rates() == {}  # idle adapters drop out
