"""Router choice: round robin and fewest in flight, skipping instances that failed."""

from __future__ import annotations

import collections

import pytest

from lorafleet.frontend.router import LeastInflightRouter, RoundRobinRouter, make_router
from lorafleet.proto.discovery import Instance
from tests.hand_clock import HandClock


def _instances(count: int) -> list[Instance]:
    return [
        Instance(namespace="ns", component="backend", endpoint="generate", instance_id=i,
                 subject=f"ns.backend.generate-{i:x}")
        for i in range(1, count + 1)
    ]  # fmt: skip


def test_round_robin_spreads_requests_evenly() -> None:
    router, instances = RoundRobinRouter(), _instances(3)
    picks = collections.Counter(router.pick("demo", instances).instance_id for _ in range(300))
    assert picks == {1: 100, 2: 100, 3: 100}


def test_round_robin_keeps_a_turn_per_model() -> None:
    router, instances = RoundRobinRouter(), _instances(2)
    first_a = router.pick("a", instances)
    first_b = router.pick("b", instances)
    assert first_a == first_b == instances[0]


def test_excluded_instances_are_skipped_and_none_when_all_are_excluded() -> None:
    instances = _instances(3)
    for router in (RoundRobinRouter(), LeastInflightRouter()):
        for _ in range(6):
            assert router.pick("demo", instances, exclude={1, 3}) == instances[1]
        assert router.pick("demo", instances, exclude={1, 2, 3}) is None
        assert router.pick("demo", [], exclude=()) is None


def test_least_inflight_picks_the_idle_instance() -> None:
    router, instances = LeastInflightRouter(), _instances(3)
    router.started(1)
    router.started(1)
    router.started(3)
    assert router.pick("demo", instances) == instances[1]
    router.finished(1)
    router.finished(1)
    router.started(2)
    router.started(2)
    assert router.pick("demo", instances) == instances[0]


def test_least_inflight_rotates_among_equally_loaded_instances() -> None:
    router, instances = LeastInflightRouter(), _instances(3)
    picks = collections.Counter(router.pick("demo", instances).instance_id for _ in range(30))
    assert picks == {1: 10, 2: 10, 3: 10}


def test_inflight_counts_return_to_zero() -> None:
    router = RoundRobinRouter()
    router.started(7)
    router.finished(7)
    router.finished(7)
    assert router.inflight(7) == 0


def test_unknown_router_name_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="round-robin, least-inflight"):
        make_router("random")


def test_adapters_go_to_the_least_busy_instance_whatever_the_router() -> None:
    instances = _instances(3)
    router = RoundRobinRouter()
    router.started(1)
    router.started(3)
    picks = {router.pick_least_inflight("pirate", instances).instance_id for _ in range(6)}
    assert picks == {2}
    assert router.pick_least_inflight("pirate", instances, exclude={2}).instance_id in {1, 3}


def _send(router: RoundRobinRouter, instance_id: int, requests: int) -> None:
    for _ in range(requests):
        router.started(instance_id)
        router.finished(instance_id)


def test_among_idle_copies_the_one_sent_the_fewest_lately_wins() -> None:
    """Copies of a popular adapter share its requests by what their instances were sent,
    not in turn: the instance that also serves other models gets fewer of them."""
    router, instances = RoundRobinRouter(clock=HandClock()), _instances(3)
    _send(router, 1, 5)  # instance 1 also serves another model
    _send(router, 2, 2)
    picks = []
    for _ in range(6):
        pick = router.pick_least_inflight("pirate", instances).instance_id
        picks.append(pick)
        _send(router, pick, 1)
    assert picks[:2] == [3, 3] and 1 not in picks[:5]


def test_what_an_instance_was_sent_long_ago_fades() -> None:
    clock = HandClock()
    router, instances = RoundRobinRouter(clock=clock), _instances(2)
    _send(router, 1, 100)
    clock.now += 60  # six half-lives: 100 reads as about 1.6
    _send(router, 2, 2)
    assert router.pick_least_inflight("pirate", instances) == instances[0]
    clock.now += 20_000  # far past where the weights would overflow a float
    _send(router, 1, 3)
    _send(router, 2, 1)
    assert router.pick_least_inflight("pirate", instances) == instances[1]
