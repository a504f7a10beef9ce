"""``FleetLoads`` over a real etcd: its per-adapter indexes, and the on-demand order it gives.

The records are written by the test (what workers publish under their leases).
"""

from __future__ import annotations

from lorafleet.discovery.keys import load_key
from lorafleet.frontend.fleet_loads import FleetLoads
from lorafleet.frontend.on_demand import least_loaded_first
from lorafleet.proto.fleet_load import InstanceLoad, LoadFailure, encode_instance_load

FULL, SILENT, BUSY, IDLE = 0xA1, 0xB2, 0xC3, 0xD4


async def _put(etcd, namespace: str, instance_id: int, load: InstanceLoad) -> None:
    key = load_key(namespace, "backend", "generate", instance_id)
    await etcd.put(key.encode(), encode_instance_load(load))


async def test_least_loaded_first_prefers_a_free_slot_then_fewest_in_flight(
    etcd, namespace
) -> None:
    failure = LoadFailure(code="not_found", message="no such file", at=1.0)
    full = InstanceLoad(base_model="demo", max_loras=1, loaded=["a"], failed={"bad": failure},
                        demand={"a": 1.0})  # fmt: skip
    busy = InstanceLoad(base_model="demo", max_loras=2, in_flight=5, loading=["b"],
                        demand={"a": 1.0})  # fmt: skip
    idle = InstanceLoad(base_model="demo", max_loras=2, in_flight=1, demand={"a": 0.5})
    for instance_id, load in ((FULL, full), (BUSY, busy), (IDLE, idle)):
        await _put(etcd, namespace, instance_id, load)
    loads = await FleetLoads.start(etcd, namespace)
    try:
        # rendezvous order as given; SILENT publishes no record (a worker from before records)
        everyone = [FULL, SILENT, BUSY, IDLE]
        assert least_loaded_first(everyone, loads, "a") == [IDLE, BUSY, SILENT, FULL]
        assert least_loaded_first([SILENT, FULL], loads, "a") == [SILENT, FULL]
        assert least_loaded_first(everyone, loads, "b") == [BUSY, IDLE, SILENT, FULL]  # joins
        assert loads.demand("a") == 2.5
        assert loads.loading("b") == [BUSY]
        assert loads.failures("bad") == {FULL: failure}

        await etcd.delete(load_key(namespace, "backend", "generate", FULL).encode())
        await loads.cache.wait_until(lambda items: len(items) == 2, 5)
        assert loads.failures("bad") == {}
        assert loads.of(FULL) is None and loads.of(IDLE) is not None
    finally:
        await loads.aclose()


async def test_a_full_instance_whose_eviction_costs_least_comes_first(etcd, namespace) -> None:
    """With every slot taken, the load goes where the adapter the worker would evict has the
    least fleet demand, not by rendezvous order or requests in flight alone; evicting a
    placed copy (placement loads it again) only where no other full instance can take it,
    and never first where nothing may go."""
    popular = InstanceLoad(base_model="demo", max_loras=2, loaded=["hot", "warm"],
                           demand={"hot": 1.0, "warm": 0.3}, evicts="warm")  # fmt: skip
    rotating = InstanceLoad(base_model="demo", max_loras=2, in_flight=4, loaded=["warm2", "cold"],
                            demand={"warm2": 1.0, "cold": 0.01}, evicts="cold")  # fmt: skip
    placed = InstanceLoad(base_model="demo", max_loras=1, loaded=["kept"], demand={"kept": 0.001},
                          evicts="kept", evicts_placed=True)  # fmt: skip
    stuck = InstanceLoad(base_model="demo", max_loras=1, loaded=["busy"],
                         demand={"busy": 2.0})  # nothing may go  # fmt: skip
    records = ((FULL, popular), (BUSY, rotating), (IDLE, placed), (SILENT, stuck))
    for instance_id, load in records:
        await _put(etcd, namespace, instance_id, load)
    loads = await FleetLoads.start(etcd, namespace)
    try:
        assert least_loaded_first([SILENT, IDLE, FULL, BUSY], loads, "new") == [
            BUSY, FULL, IDLE, SILENT
        ]  # fmt: skip
    finally:
        await loads.aclose()


async def test_among_full_instances_evicting_a_trickle_the_least_busy_comes_first(
    etcd, namespace
) -> None:
    """Evicting an adapter asked for less than once in ten seconds costs about the same
    anywhere, so the tail's loads go to the instance serving the fewest requests."""
    busy = InstanceLoad(base_model="demo", max_loras=2, loaded=["hot", "rare"],
                        demand={"hot": 4.0, "rare": 0.01}, evicts="rare")  # fmt: skip
    quiet = InstanceLoad(base_model="demo", max_loras=2, loaded=["mild", "scarce"],
                         demand={"mild": 0.5, "scarce": 0.05}, evicts="scarce")  # fmt: skip
    for instance_id, load in ((BUSY, busy), (IDLE, quiet)):
        await _put(etcd, namespace, instance_id, load)
    loads = await FleetLoads.start(etcd, namespace)
    try:
        assert least_loaded_first([BUSY, IDLE], loads, "new") == [IDLE, BUSY]
    finally:
        await loads.aclose()


async def test_an_instance_past_the_load_bound_comes_after_the_others_even_with_a_free_slot(
    etcd, namespace
) -> None:
    """An instance serving more than 1.25 times the mean takes a cold load only when no
    other instance may: its free slot would make the busiest instance busier still."""
    busiest = InstanceLoad(base_model="demo", max_loras=2, loaded=["hot"], demand={"hot": 3.0})
    quiet = InstanceLoad(base_model="demo", max_loras=1, loaded=["mild"], demand={"mild": 0.5},
                         evicts="mild")  # fmt: skip
    stuck = InstanceLoad(base_model="demo", max_loras=1, loaded=["busy"], demand={"busy": 0.5})
    for instance_id, load in ((BUSY, busiest), (IDLE, quiet), (FULL, stuck)):
        await _put(etcd, namespace, instance_id, load)
    loads = await FleetLoads.start(etcd, namespace)
    try:
        assert least_loaded_first([BUSY, FULL, IDLE], loads, "new") == [IDLE, BUSY, FULL]
    finally:
        await loads.aclose()
