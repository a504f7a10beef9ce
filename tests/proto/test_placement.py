"""Rendezvous placement: deterministic, and minimal movement when instances come and go."""

from __future__ import annotations

from proto.placement import chosen_instances, rendezvous_order

ADAPTERS = [f"adapter-{i}" for i in range(200)]


def test_order_is_the_same_whatever_the_input_order() -> None:
    assert rendezvous_order("pirate", [3, 1, 2]) == rendezvous_order("pirate", [2, 3, 1])


def test_replicas_all_and_zero() -> None:
    assert sorted(chosen_instances("pirate", "all", [1, 2, 3])) == [1, 2, 3]
    assert chosen_instances("pirate", 0, [1, 2, 3]) == []
    assert len(chosen_instances("pirate", 5, [1, 2])) == 2


def test_a_joining_instance_moves_only_adapters_that_rank_it_first() -> None:
    before = {a: set(chosen_instances(a, 2, [1, 2, 3])) for a in ADAPTERS}
    after = {a: set(chosen_instances(a, 2, [1, 2, 3, 4])) for a in ADAPTERS}
    moved = [a for a in ADAPTERS if before[a] != after[a]]
    assert all(4 in after[a] and len(before[a] - after[a]) == 1 for a in moved)
    assert 0 < len(moved) < len(ADAPTERS) * 0.75  # about half: 2 of 4 slots


def test_a_leaving_instance_moves_only_its_own_adapters() -> None:
    before = {a: set(chosen_instances(a, 2, [1, 2, 3, 4])) for a in ADAPTERS}
    after = {a: set(chosen_instances(a, 2, [1, 2, 3])) for a in ADAPTERS}
    assert all(before[a] == after[a] for a in ADAPTERS if 4 not in before[a])
