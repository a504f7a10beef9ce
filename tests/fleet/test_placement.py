"""Placement: deterministic, bounded, sticky, and minimal movement when instances come and go."""

from __future__ import annotations

import math

import pytest

from lorafleet.fleet.placement import (
    LOAD_BOUND_EPS,
    RendezvousCache,
    chosen_instances,
    may_drop_copy,
    plan_copies,
    rendezvous_order,
    wanted_copies,
)

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


def _held(plan: dict[str, list[int]]) -> dict[int, set[str]]:
    held: dict[int, set[str]] = {}
    for name, where in plan.items():
        for iid in where:
            held.setdefault(iid, set()).add(name)
    return held


def test_eight_single_copies_fill_four_instances_of_two_slots_evenly() -> None:
    """The issue's case: rendezvous alone placed 6 on 3 instances and left one empty."""
    plan = plan_copies({f"a{i}": 1 for i in range(8)}, {1: 2, 2: 2, 3: 2, 4: 2})
    assert all(len(where) == 1 for where in plan.values())
    assert sorted(len(names) for names in _held(plan).values()) == [2, 2, 2, 2]


def test_an_instance_without_a_free_slot_gets_nothing_while_another_has_room() -> None:
    full = {1: {"hand-a", "hand-b"}}  # loaded by hand, not desired: they keep their slots
    plan = plan_copies({name: 1 for name in ADAPTERS[:6]}, {1: 2, 2: 4, 3: 4}, held=full)
    assert all(1 not in where for where in plan.values())
    assert all(len(where) == 1 for where in plan.values())


def test_no_instance_holds_more_than_its_bound() -> None:
    slots = {iid: 100 for iid in range(1, 9)}
    plan = plan_copies({name: 2 for name in ADAPTERS}, slots)
    loads = [len(names) for names in _held(plan).values()]
    assert max(loads) <= math.ceil((1 + LOAD_BOUND_EPS) * 400 / 8)
    assert all(len(where) == 2 for where in plan.values())


def test_copies_already_held_stay_where_they_are() -> None:
    slots = {1: 100, 2: 100, 3: 100, 4: 100}
    before = plan_copies({name: 1 for name in ADAPTERS}, slots)
    moved_by_hand = {name: [iid % 4 + 1 for iid in where] for name, where in before.items()}
    after = plan_copies({name: 1 for name in ADAPTERS}, slots, held=_held(moved_by_hand))
    assert after == moved_by_hand


def test_adding_or_removing_an_instance_moves_few_adapters() -> None:
    cache = RendezvousCache()
    slots = {iid: 200 for iid in range(1, 6)}
    before = plan_copies({name: 2 for name in ADAPTERS}, slots, cache=cache)
    grown = plan_copies({name: 2 for name in ADAPTERS}, {**slots, 6: 200}, cache=cache)
    moved = [name for name in ADAPTERS if set(before[name]) != set(grown[name])]
    assert all(6 in grown[name] for name in moved)
    assert len(moved) < len(ADAPTERS) * 0.5  # about a third: 2 of 6 copies

    del slots[5]
    shrunk = plan_copies({name: 2 for name in ADAPTERS}, slots, held=_held(before), cache=cache)
    assert all(set(shrunk[name]) == set(before[name]) for name in ADAPTERS if 5 not in before[name])


def test_the_cache_ranks_as_rendezvous_order_does_after_changes() -> None:
    cache = RendezvousCache()
    for ids in ([1, 2, 3], [1, 2, 3, 4, 5], [2, 5, 9]):
        cache.set_instances(ids)
        assert all(cache.order(name) == rendezvous_order(name, ids) for name in ADAPTERS[:20])


def test_orders_not_asked_for_catch_up_with_any_number_of_changes() -> None:
    """Orders catch up lazily; one not asked for over more changes than the cache logs is
    rebuilt, one asked for in between is updated by difference."""
    cache = RendezvousCache()
    cache.set_instances([1, 2, 3])
    assert cache.order("old") == rendezvous_order("old", [1, 2, 3])
    ids = [1, 2, 3]
    for step in range(200):
        ids = [*ids[1:], 100 + step] if step % 2 else [*ids, 100 + step]
        cache.set_instances(ids)
        if step % 7 == 0:
            assert cache.order("often") == rendezvous_order("often", ids)
    assert cache.order("old") == rendezvous_order("old", ids)
    assert cache.order("often") == rendezvous_order("often", ids)


def test_copies_grow_before_saturation_and_shrink_with_hysteresis() -> None:
    assert wanted_copies(0.0, copy_rps=10) == 0
    assert wanted_copies(6.9, copy_rps=10) == 1
    assert wanted_copies(7.1, copy_rps=10) == 2  # prefetch: before one copy reaches 10/s
    assert not may_drop_copy(6.0, 2, copy_rps=10)  # between 5 and 7: keep both
    assert may_drop_copy(4.0, 2, copy_rps=10)
    assert may_drop_copy(0.0, 1, copy_rps=10)


def test_a_newcomer_beside_two_full_holders_leaves_no_adapter_short() -> None:
    """Both holders drop copies for the newcomer; when they drop the same adapter, another
    copy moves to the newcomer so that adapter still gets two instances."""
    names = [f"fleet{i}" for i in range(10)]
    held = {1: set(names), 2: set(names)}
    plan = plan_copies({name: 2 for name in names}, {1: 10, 2: 10, 3: 10}, held=held)
    assert all(len(set(where)) == 2 for where in plan.values())
    assert sorted(len(names) for names in _held(plan).values()) == [2, 9, 9]


def _on_one_instance(instances: list[int]) -> tuple[str, str]:
    """Two adapters whose rendezvous order puts them first on the same instance."""
    first: dict[int, str] = {}
    for name in ADAPTERS:
        top = rendezvous_order(name, instances)[0]
        if top in first:
            return first[top], name
        first[top] = name
    raise AssertionError("every adapter ranks a different instance first")


def test_the_two_busiest_adapters_go_to_different_instances() -> None:
    """Placed by count alone they share an instance that then serves most of the fleet's
    requests; by demand each gets an instance to itself."""
    slots = {1: 4, 2: 4, 3: 4, 4: 4}
    busy_a, busy_b = _on_one_instance(list(slots))
    quiet = [name for name in ADAPTERS if name not in (busy_a, busy_b)][:6]
    copies = dict.fromkeys([busy_a, busy_b, *quiet], 1)
    demand = {busy_a: 4.0, busy_b: 4.0} | dict.fromkeys(quiet, 0.5)

    by_count = plan_copies(copies, slots)
    assert by_count[busy_a] == by_count[busy_b]  # the case this test is about

    by_demand = plan_copies(copies, slots, demand=demand)
    assert by_demand[busy_a] != by_demand[busy_b]
    held = _held(by_demand)
    assert held[by_demand[busy_a][0]] == {busy_a}
    assert held[by_demand[busy_b][0]] == {busy_b}
    assert all(len(where) == 1 for where in by_demand.values())


def test_a_held_copy_moves_only_when_its_instance_is_well_past_its_share() -> None:
    copies = {"a": 1, "b": 1, "c": 1, "d": 1}
    held = {1: {"a", "b"}, 2: {"c", "d"}}
    slots = {1: 4, 2: 4}

    def plan_with(busy_rps: float) -> dict[str, list[int]]:
        demand = {"a": busy_rps, "b": busy_rps, "c": 1.0, "d": 1.0}
        return plan_copies(copies, slots, held=held, demand=demand)

    assert _held(plan_with(3.0)) == held  # 6 of 8 req/s: within 1.5x its share of 4
    moved = plan_with(4.0)  # 8 of 10 req/s: past 1.5x its share of 5
    assert moved["a"] == [1] and moved["b"] == [2]


@pytest.mark.parametrize("copies", [1, 2, 3])
def test_an_adapter_goes_only_where_allowed_whatever_the_copies_asked(copies: int) -> None:
    plan = plan_copies({"wide": copies, "narrow": 3}, {1: 2, 2: 2, 3: 2}, allowed={"wide": [3]})
    assert plan["wide"] == [3]
    assert sorted(plan["narrow"]) == [1, 2, 3]


def test_a_full_allowed_instance_hands_its_copy_to_one_with_room() -> None:
    for first in ("a", "b", "c", "d"):  # whichever instance rendezvous gives it first
        plan = plan_copies({first: 1, "wide": 1}, {1: 1, 2: 1}, allowed={"wide": [2]})
        assert plan == {first: [1], "wide": [2]}
