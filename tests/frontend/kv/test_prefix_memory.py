"""The approximate mode's memory: where prefixes were sent, for a TTL, within an LRU bound."""

from __future__ import annotations

from lorafleet.frontend.kv.prefix_memory import PrefixMemory
from tests.hand_clock import HandClock


def test_a_prefix_sent_is_assumed_held_until_its_ttl() -> None:
    clock = HandClock()
    memory = PrefixMemory(ttl_s=10, clock=clock)
    memory.remember([1, 2, 3], 7)
    memory.remember([1, 2], 8)
    assert memory.overlaps([1, 2, 3, 4], {7, 8, 9}) == {7: 3, 8: 2}
    clock.now += 10.5
    assert memory.overlaps([1, 2, 3], {7, 8}) == {}


def test_the_least_recently_sent_blocks_leave_first_past_the_bound() -> None:
    memory = PrefixMemory(max_blocks=3)
    memory.remember([1, 2], 7)
    memory.remember([3], 7)
    memory.remember([1], 8)  # 1 is fresh again
    memory.remember([4], 8)  # 2 goes
    assert len(memory) == 3
    assert memory.overlaps([1, 2], {7, 8}) == {7: 1, 8: 1}


def test_an_instance_forgotten_is_never_assumed_to_hold_anything() -> None:
    memory = PrefixMemory()
    memory.remember([1, 2], 7)
    memory.remember([1], 8)
    memory.forget_instance(7)
    assert memory.overlaps([1, 2], {7, 8}) == {8: 1}
    memory.forget_instance(8)
    assert len(memory) == 0
