"""Fleet placement across real mocker workers: desired state in etcd, no coordinator."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import httpx
import msgspec
import pytest

from lorafleet.discovery.keys import adapter_key, card_prefix
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.fleet.placement import LOAD_BOUND_EPS, chosen_instances, rendezvous_order
from lorafleet.proto.adapters import AdapterSpec, LoraSource
from lorafleet.proto.discovery import decode_card
from lorafleet.proto.naming import lora_slug
from tests.worker.adapters import adapter_digest, make_adapter_dir
from tests.worker.fleet import (
    assert_invariant_everywhere,
    holders,
    instance_id,
    per_instance,
    put_spec,
    wait_for_holders,
)

NAMES = [f"fleet{i}" for i in range(10)]
TTL_S = 2


@pytest.fixture
async def specs(etcd, namespace, tmp_path: Path) -> list[AdapterSpec]:
    """Ten adapters at replicas 2, written as desired state."""
    return [await put_spec(etcd, namespace, tmp_path / "adapters", n, replicas=2) for n in NAMES]


@pytest.fixture
def fleet_worker(worker_factory, tmp_path: Path):
    def start(*args: str, max_loras: int = 10, **kwargs):
        env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
        flags = ("--enable-lora", "--max-loras", str(max_loras), *args)
        return worker_factory(*flags, env=env, **kwargs)

    return start


def _placed(instances: int, copies: int = 2, names: list[str] = NAMES):
    """Every adapter on ``copies`` of ``instances`` live instances, none over its load bound."""
    bound = math.ceil((1 + LOAD_BOUND_EPS) * copies * len(names) / instances)

    def done(where, bases) -> bool:
        return (
            len(bases) == instances
            and all(len(where.get(name, ())) == copies for name in names)
            and all(on <= bases for on in where.values())
            and max(per_instance(where).values(), default=0) <= bound
        )

    return done


async def test_fleet_places_each_adapter_on_two_instances_and_heals(
    fleet_worker, specs, etcd, namespace
):
    workers = [await asyncio.to_thread(fleet_worker) for _ in range(3)]
    await wait_for_holders(etcd, namespace, _placed(3), timeout_s=20)

    workers[0].kill()
    await wait_for_holders(etcd, namespace, _placed(2), timeout_s=TTL_S + 5)

    before, bases_before = await holders(etcd, namespace)
    workers.append(await asyncio.to_thread(fleet_worker))
    after = await wait_for_holders(etcd, namespace, _placed(3), timeout_s=20)
    _, bases_after = await holders(etcd, namespace)
    (newcomer_id,) = bases_after - bases_before
    moved = [name for name in NAMES if before[name] != after[name]]
    assert moved, "the newcomer got no copy: the survivors stayed above the load bound"
    assert all(newcomer_id in after[name] for name in moved)
    assert all(len(before[name] - after[name]) == 1 for name in moved)  # one copy moved, not two

    await asyncio.to_thread(workers[1].terminate)
    workers[1] = await asyncio.to_thread(fleet_worker)  # restarted: reloads its share by itself
    await wait_for_holders(etcd, namespace, _placed(3), timeout_s=20)
    await assert_invariant_everywhere(workers[1:], etcd, namespace)


async def test_a_copy_moving_to_a_newcomer_is_loaded_there_before_it_leaves(
    fleet_worker, specs, etcd, namespace
):
    """Make before break: the newcomer's loads take half a second, and meanwhile every
    adapter keeps its two live copies (the old holder unloads only once the new one has it)."""
    for _ in range(2):
        await asyncio.to_thread(fleet_worker)
    before = await wait_for_holders(etcd, namespace, _placed(2), timeout_s=20)
    fewest = dict.fromkeys(NAMES, 2)

    def count_copies(cards: WatchCache) -> None:
        for name in NAMES:
            live = sum(1 for card in cards.items.values() if card.lora and card.lora.name == name)
            fewest[name] = min(fewest[name], live)

    cards = await WatchCache.start(etcd, card_prefix(namespace), decode_card)
    cards.subscribe(lambda *_: count_copies(cards))
    try:
        await asyncio.to_thread(fleet_worker, "--engine-option", "add_adapter_delay_s=0.5")
        after = await wait_for_holders(etcd, namespace, _placed(3), timeout_s=30)
    finally:
        await cards.aclose()
    assert any(before[name] != after[name] for name in NAMES), "no copy moved"
    assert fewest == dict.fromkeys(NAMES, 2)


async def test_eight_single_copies_fill_four_workers_of_two_slots(
    fleet_worker, etcd, namespace, tmp_path: Path
):
    """The issue's case: rendezvous alone left one worker empty and two adapters unplaced."""
    workers = [await asyncio.to_thread(fleet_worker, max_loras=2) for _ in range(4)]
    names = [f"eight{i}" for i in range(8)]
    for name in names:
        await put_spec(etcd, namespace, tmp_path / "adapters", name, replicas=1)

    where = await wait_for_holders(etcd, namespace, _placed(4, 1, names), timeout_s=30)
    assert sorted(per_instance(where).values()) == [2, 2, 2, 2]
    await assert_invariant_everywhere(workers, etcd, namespace)


async def test_a_full_instance_gets_no_new_placement_while_another_has_room(
    fleet_worker, etcd, namespace, tmp_path: Path
):
    full, roomy = [await asyncio.to_thread(fleet_worker, max_loras=2) for _ in range(2)]
    full_id, roomy_id = await instance_id(full), await instance_id(roomy)
    async with httpx.AsyncClient(base_url=full.url) as client:
        for name in ("hand0", "hand1"):  # loaded by hand: not desired, and they keep their slots
            uri = f"file://{make_adapter_dir(tmp_path / 'hand', name)}"
            body = {"lora_name": name, "source": {"uri": uri}}
            assert (await client.post("/v1/loras", json=body)).status_code == 200
    # adapters whose rendezvous order puts the full instance first
    names = [
        n for i in range(40) if rendezvous_order(n := f"want{i}", [full_id, roomy_id])[0] == full_id
    ][:2]
    for name in names:
        await put_spec(etcd, namespace, tmp_path / "adapters", name, replicas=1)

    where = await wait_for_holders(
        etcd, namespace, lambda w, _: all(len(w.get(n, ())) == 1 for n in names), timeout_s=20
    )
    assert all(where[name] == {roomy_id} for name in names)
    assert where["hand0"] == where["hand1"] == {full_id}
    await assert_invariant_everywhere([full, roomy], etcd, namespace)


async def test_the_rendezvous_policy_places_by_hash_alone(
    fleet_worker, etcd, namespace, tmp_path: Path
):
    """``--placement-policy rendezvous``: the old placement, kept for ``bench.placement``."""
    workers = [await asyncio.to_thread(fleet_worker, "--placement-policy", "rendezvous")
               for _ in range(2)]  # fmt: skip
    for name in NAMES:
        await put_spec(etcd, namespace, tmp_path / "adapters", name, replicas=1)

    def by_hash(where, bases) -> bool:
        expected = {name: set(chosen_instances(name, 1, bases)) for name in NAMES}
        return len(bases) == 2 and where == expected

    await wait_for_holders(etcd, namespace, by_hash, timeout_s=20)
    await assert_invariant_everywhere(workers, etcd, namespace)


async def test_a_changed_source_of_a_declared_adapter_swaps_its_version_on_every_holder(
    fleet_worker, etcd, namespace, tmp_path: Path
) -> None:
    """The desired state points ``fx`` at new weights: both copies swap to them (make before
    break), and every card shows the new digest."""
    workers = [fleet_worker(), fleet_worker()]
    await put_spec(etcd, namespace, tmp_path / "v1", "fx", replicas=2)

    async def digests() -> list[str]:
        listing = await etcd.get_prefix(card_prefix(namespace).encode())
        cards = [decode_card(kv.value).lora for kv in listing]
        return [lora.digest for lora in cards if lora is not None and lora.name == "fx"]

    async def wait_for_digests(digest: str) -> None:
        async with asyncio.timeout(30):
            while await digests() != [digest, digest]:
                await asyncio.sleep(0.1)

    await wait_for_digests(adapter_digest())
    new = make_adapter_dir(tmp_path / "v2", "fx", weights=b"\x02" * 16)
    spec = AdapterSpec(name="fx", base_model="demo", source=LoraSource(uri=f"file://{new}"),
                       replicas=2)  # fmt: skip
    await etcd.put(adapter_key(namespace, lora_slug("fx")).encode(), msgspec.json.encode(spec))
    await wait_for_digests(adapter_digest(weights=b"\x02" * 16))
    await assert_invariant_everywhere(workers, etcd, namespace)
