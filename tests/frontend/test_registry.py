"""The model registry: a name is served while a live instance record has its card."""

from __future__ import annotations

import asyncio
import random

import msgspec

from lorafleet.discovery.keys import base_card_key, instance_key, lora_card_key, parse_card_key
from lorafleet.frontend.card_view import CardView
from lorafleet.frontend.registry import ModelRegistry, ServedModel, build_index
from lorafleet.proto.discovery import Instance, LoraInfo, ModelDeploymentCard, encode_record
from lorafleet.proto.naming import lora_id, lora_slug

NS = "ns"


def _instance(instance_id: int, started_at: float = 100.0, ns: str = NS) -> Instance:
    return Instance(namespace=ns, component="backend", endpoint="generate",
                    instance_id=instance_id, subject=f"{ns}.backend.generate-{instance_id:x}",
                    started_at=started_at)  # fmt: skip


def _base(name: str = "demo") -> ModelDeploymentCard:
    return ModelDeploymentCard(display_name=name, slug=lora_slug(name), source_path=f"/m/{name}")


def _adapter(name: str, base: str = "demo") -> ModelDeploymentCard:
    lora = LoraInfo(name=name, lora_id=lora_id(name), base_model=base, uri=f"file:///a/{name}")
    return ModelDeploymentCard(display_name=name, slug=lora_slug(name), lora=lora)


def _records(*ids: int, adapters: dict[int, list[str]] | None = None):
    instances = {instance_key(NS, "backend", "generate", i): _instance(i) for i in ids}
    cards = {base_card_key(NS, "backend", "generate", i): CardView.of(_base()) for i in ids}
    for i, names in (adapters or {}).items():
        for name in names:
            key = lora_card_key(NS, "backend", "generate", i, lora_slug(name))
            cards[key] = CardView.of(_adapter(name))
    return instances, cards


def test_a_name_served_by_two_instances_is_listed_once_with_both() -> None:
    index = build_index(*_records(2, 1))
    assert list(index) == ["demo"]
    assert [i.instance_id for i in index["demo"].instances] == [1, 2]


def test_adapters_have_their_base_as_parent_and_their_uri_without_its_path_as_root() -> None:
    index = build_index(*_records(1, 2, adapters={2: ["pirate"]}))
    assert list(index) == ["demo", "pirate"]
    pirate = index["pirate"]
    assert (pirate.parent, pirate.root) == ("demo", "file:///***/pirate")  # was file:///a/pirate
    assert [i.instance_id for i in pirate.instances] == [2]
    assert (index["demo"].parent, index["demo"].root) == (None, "file:///***/demo")  # /m/demo


def test_a_card_without_a_live_instance_record_is_not_served() -> None:
    instances, cards = _records(1, 2, adapters={2: ["pirate"]})
    del instances[instance_key(NS, "backend", "generate", 2)]
    index = build_index(instances, cards)
    assert list(index) == ["demo"]
    assert [i.instance_id for i in index["demo"].instances] == [1]


def test_an_instance_without_cards_serves_nothing() -> None:
    instances, _cards = _records(1)
    assert build_index(instances, {}) == {}


async def test_registry_follows_etcd_as_workers_come_and_go(etcd, namespace) -> None:
    async with await ModelRegistry.start(etcd, namespace) as registry:
        assert registry.names() == []
        keys = (namespace, "backend", "generate", 0xAB)
        instance = Instance(namespace=namespace, component="backend", endpoint="generate",
                            instance_id=0xAB, subject="x", started_at=5.0)  # fmt: skip
        await etcd.put(instance_key(*keys).encode(), encode_record(instance))
        await etcd.put(base_card_key(*keys).encode(), encode_record(_base()))
        pirate_key = lora_card_key(*keys, lora_slug("pirate"))
        await etcd.put(pirate_key.encode(), encode_record(_adapter("pirate")))
        await _until(lambda: registry.names() == ["demo", "pirate"])
        assert registry.get("pirate").created == 5
        await etcd.delete(pirate_key.encode())
        await _until(lambda: registry.names() == ["demo"])
        await etcd.delete(instance_key(*keys).encode())
        await _until(lambda: registry.names() == [])
        assert registry.known("demo")


async def _until(condition, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def test_registry_kept_change_by_change_equals_a_full_rebuild(etcd, namespace) -> None:
    """Seeded random puts and deletes of instances and cards; after each batch the
    registry (refreshed name by name) lists exactly what a whole rebuild lists."""
    rng = random.Random(9)
    async with await ModelRegistry.start(etcd, namespace) as registry:
        for batch in range(1, 9):
            version = registry.version()
            assert registry.joined(_name_bytes) is registry.joined(_name_bytes)  # kept
            for _ in range(15):
                await _random_change(etcd, namespace, rng)
            await _caught_up(etcd, registry, namespace, batch)
            expected = build_index(registry.instance_cache.items, registry.card_cache.items)
            assert registry.version() != version  # the marker card changed at least
            assert registry.models() == list(expected.values())
            assert registry.names() == list(expected)
            assert registry.first_names(2) == list(expected)[:2]
            assert registry.count() == len(expected)
            assert registry.each(lambda served: served.name) == list(expected)
            assert registry.joined(_name_bytes) == b",".join(name.encode() for name in expected)
            assert registry.known("robot") == any(
                card.name == "robot" for card in registry.card_cache.items.values()
            )
            assert _cards_on(registry) == _filed_cards(registry)  # asked each batch: kept


_NAMES = ("demo", "pirate", "robot", "a/b", "zed", "marker")


def _cards_on(registry: ModelRegistry) -> dict[tuple[str, int], CardView]:
    """Every (name, instance) card as ``card_on`` answers it."""
    found = {}
    for name in _NAMES:
        for instance_id in (1, 2, 3, 4, 98):
            if (card := registry.card_on(name, instance_id)) is not None:
                found[name, instance_id] = card
    return found


def _filed_cards(registry: ModelRegistry) -> dict[tuple[str, int], CardView]:
    """Every (name, instance) card in the card cache, read straight from its keys."""
    return {(card.name, parse_card_key(key)[1]): card
            for key, card in registry.card_cache.items.items()}  # fmt: skip


def _name_bytes(served: ServedModel) -> bytes:
    return served.name.encode()


async def _random_change(etcd, namespace: str, rng: random.Random) -> None:
    instance_id = rng.randint(1, 4)
    keys = (namespace, "backend", "generate", instance_id)
    name = rng.choice(["demo", "pirate", "robot", "a/b", "zed"])
    if rng.random() < 0.3:
        key = instance_key(*keys)
        record = _instance(instance_id, started_at=rng.randint(1, 9), ns=namespace)
    elif name == "demo":
        key, record = base_card_key(*keys), _base()
    else:
        key, record = lora_card_key(*keys, lora_slug(name)), _adapter(name)
    if rng.random() < 0.4:
        await etcd.delete(key.encode())
    else:
        await etcd.put(key.encode(), encode_record(record))


async def _caught_up(etcd, registry: ModelRegistry, namespace: str, batch: int) -> None:
    """Put a marker under each prefix and wait for both caches to have it (watch order)."""
    instance = _instance(99, started_at=batch, ns=namespace)
    await etcd.put(instance_key(namespace, "backend", "generate", 99).encode(),
                   encode_record(instance))  # fmt: skip
    card = msgspec.structs.replace(_base("marker"), created=batch)
    await etcd.put(base_card_key(namespace, "backend", "generate", 98).encode(),
                   encode_record(card))  # fmt: skip
    await _until(lambda: instance in registry.instance_cache.items.values()
                 and CardView.of(card) in registry.card_cache.items.values())  # fmt: skip


async def test_many_names_at_start_and_one_more_later_are_listed_in_name_order(
    etcd, namespace
) -> None:
    keys = (namespace, "backend", "generate", 7)
    await etcd.put(instance_key(*keys).encode(), encode_record(_instance(7, ns=namespace)))
    names = [f"a{index:03d}" for index in random.Random(3).sample(range(200), 100)]
    for name in names:
        card_key = lora_card_key(*keys, lora_slug(name))
        await etcd.put(card_key.encode(), encode_record(_adapter(name)))
    async with await ModelRegistry.start(etcd, namespace) as registry:
        assert registry.names() == sorted(names)
        await etcd.put(lora_card_key(*keys, lora_slug("a0999")).encode(),
                       encode_record(_adapter("a0999")))  # fmt: skip
        await _until(lambda: "a0999" in registry.names())
        assert registry.names() == sorted([*names, "a0999"])
