"""The LoRA controller in-process: the one adapter ledger, on the mocker with real etcd and NATS.

The controller owns slots, ids, collisions and eviction; the mocker only adds
and removes. Every test checks what a user would see: the typed answer or
error, the cards in etcd, and what the engine serves.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import nats
import pytest

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import card_prefix
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.proto.adapters import LoadLoraRequest, LoraSource, UnloadLoraRequest
from lorafleet.proto.discovery import decode_card
from lorafleet.proto.errors import (
    CapacityError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    UpstreamError,
)
from lorafleet.proto.inference import GenerateRequest, TokenChunk
from lorafleet.proto.naming import lora_id
from lorafleet.worker.adapter_record import AdapterRecord
from lorafleet.worker.demand import DemandMeter
from lorafleet.worker.endpoint import Endpoint, EndpointAddress
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines.mocker import MockerEngine
from lorafleet.worker.eviction import Eviction
from lorafleet.worker.lora import LoRAManager, LoRAManagerConfig
from lorafleet.worker.lora_controller import Assignment, LoraController
from tests.worker.adapters import adapter_digest, make_adapter_dir

DIGEST = adapter_digest()
"""Every adapter ``make_adapter_dir`` writes has the same files, so this digest."""


def _colliding_names() -> tuple[str, str]:
    """Two names whose versions of the same files get the same ``lora_id`` (a birthday search
    over ``a<i>``: about 55,000 hashes)."""
    seen: dict[int, str] = {}
    for i in itertools.count():
        name = f"a{i}"
        other = seen.setdefault(lora_id(name, DIGEST), name)
        if other != name:
            return other, name
    raise AssertionError("unreachable")


COLLIDING = _colliding_names()


def _id(name: str) -> int:
    """The ``lora_id`` of ``name`` loaded from a ``make_adapter_dir`` directory."""
    return lora_id(name, DIGEST)


def _held(engine: MockerEngine) -> dict[str, int]:
    """The adapters the engine holds, by name (its keys are ``name@digest``)."""
    held = engine.adapters.handles.values()
    return {adapter.key.partition("@")[0]: adapter.lora_id for adapter in held}


class PeakMocker(MockerEngine):
    """The mocker, remembering the most adapters it ever held at once."""

    peak = 0

    async def add_adapter(self, name: str, lora_id: int, path: Path) -> None:
        await super().add_adapter(name, lora_id, path)
        self.peak = max(self.peak, len(self.adapters.handles))


class GatedMocker(PeakMocker):
    """The mocker, whose add of ``robot`` waits for ``gate`` (a load under way, held there)."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.adding = asyncio.Event()
        self.gate = asyncio.Event()

    async def add_adapter(self, name: str, lora_id: int, path: Path) -> None:
        if name.startswith("robot@"):
            self.adding.set()
            await self.gate.wait()
        await super().add_adapter(name, lora_id, path)


class WatchedEviction(Eviction):
    """The controller's eviction, telling when a load found another one under way."""

    def __init__(self, records: Mapping[str, AdapterRecord], demand: DemandMeter) -> None:
        super().__init__(records, demand)
        self.waited = asyncio.Event()

    def load_under_way(self, name: str) -> AdapterRecord | None:
        found = super().load_under_way(name)
        if found is not None:
            self.waited.set()
        return found


@pytest.fixture
async def lease(etcd: EtcdClient) -> AsyncIterator[LeaseKeeper]:
    keeper = await LeaseKeeper.grant(etcd, 10)
    yield keeper
    await keeper.aclose(revoke=True)


@pytest.fixture
def uris(tmp_path: Path) -> dict[str, str]:
    """file:// URIs of adapters by name."""
    names = ["pirate", "robot", "chef", "broken1", *COLLIDING]
    return {name: f"file://{make_adapter_dir(tmp_path / 'adapters', name)}" for name in names}


@pytest.fixture
def start_engine(
    nc: nats.aio.client.Client, lease: LeaseKeeper, namespace: str, tmp_path: Path
) -> Any:
    """Start a mocker whose controller publishes into this test's namespace."""

    async def start(max_loras: int = 2, engine_class: type[PeakMocker] = PeakMocker,
                    **options: Any) -> PeakMocker:  # fmt: skip
        config = EngineConfig(model="demo", enable_lora=True, max_loras=max_loras, options=options)
        engine = engine_class(config)
        engine.enable_adapters(LoRAManager(config=LoRAManagerConfig(cache_dir=tmp_path / "c")))
        await engine.start()
        address = EndpointAddress(
            namespace=namespace, component="backend", endpoint="generate",
            instance_id=lease.lease_id,
        )  # fmt: skip
        await engine.on_endpoint_ready(Endpoint(nc, lease, address))
        return engine

    return start


def _load(name: str, uri: str) -> LoadLoraRequest:
    return LoadLoraRequest(lora_name=name, source=LoraSource(uri=uri))


def _controller(engine: MockerEngine) -> LoraController:
    assert engine.lora is not None
    return engine.lora


async def _full_of_pirate_and_robot(
    start_engine: Any, uris: dict[str, str]
) -> tuple[MockerEngine, LoraController]:
    """An engine of two slots with ``pirate``, then ``robot`` loaded."""
    engine = await start_engine(max_loras=2)
    controller = _controller(engine)
    for name in ("pirate", "robot"):
        await controller.load(_load(name, uris[name]))
    return engine, controller


async def _cards(etcd: EtcdClient, namespace: str) -> dict[str, int]:
    listing = await etcd.get_prefix(card_prefix(namespace).encode())
    cards = [decode_card(kv.value) for kv in listing]
    return {card.lora.name: card.lora.lora_id for card in cards if card.lora}


async def _served(engine: MockerEngine, model: str) -> str:
    request = GenerateRequest(request_id="r", model=model, prompt="hi")
    chunks = [chunk async for chunk in engine.generate(request)]
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))


async def test_load_answers_typed_and_publishes_then_unload_retracts(
    start_engine: Any, etcd: EtcdClient, namespace: str, uris: dict[str, str]
) -> None:
    engine = await start_engine()
    controller = _controller(engine)
    loaded = await controller.load(_load("pirate", uris["pirate"]))
    assert (loaded.status, loaded.lora_name, loaded.lora_id) == (
        "success",
        "pirate",
        _id("pirate"),
    )
    assert await _cards(etcd, namespace) == {"pirate": _id("pirate")}
    assert (await _served(engine, "pirate")).startswith("pirate:0")
    assert controller.list().loras == {"pirate": _id("pirate")}
    unloaded = await controller.unload(UnloadLoraRequest(lora_name="pirate"))
    assert unloaded.status == "success" and await _cards(etcd, namespace) == {}
    with pytest.raises(NotFoundError, match="pirate"):
        await _served(engine, "pirate")


async def test_full_slots_evict_the_least_recently_used_idle_adapter(
    start_engine: Any, etcd: EtcdClient, namespace: str, uris: dict[str, str]
) -> None:
    engine, controller = await _full_of_pirate_and_robot(start_engine, uris)
    for name in ("robot", "pirate"):  # pirate served last: robot is the least recently used
        with controller.track(name):
            pass
    await controller.load(_load("chef", uris["chef"]))
    expected = {"pirate": _id("pirate"), "chef": _id("chef")}
    assert await _cards(etcd, namespace) == expected
    assert _held(engine) == expected


async def test_a_load_that_keeps_placed_copies_is_refused_where_only_placed_ones_may_go(
    start_engine: Any, etcd: EtcdClient, namespace: str, uris: dict[str, str]
) -> None:
    engine, controller = await _full_of_pirate_and_robot(start_engine, uris)
    controller.assign({name: Assignment(placed=True) for name in ("pirate", "robot")})
    keep = LoadLoraRequest(lora_name="chef", source=LoraSource(uri=uris["chef"]),
                           evict_placed=False)  # fmt: skip
    with pytest.raises(CapacityError, match="which placement chose this instance for"):
        await controller.load(keep)
    assert _held(engine).keys() == {"pirate", "robot"}

    await controller.load(_load("chef", uris["chef"]))  # may evict: the second ask
    assert "chef" in _held(engine) and len(_held(engine)) == 2
    assert (await _cards(etcd, namespace)).keys() == _held(engine).keys()


async def test_a_load_keeps_an_adapter_whose_first_request_has_not_come(
    start_engine: Any, etcd: EtcdClient, namespace: str, uris: dict[str, str]
) -> None:
    """A cold adapter has no demand yet; the requests that waited for its load are on their
    way, so another load takes a slot that has served, even a more recently used one."""
    engine, controller = await _full_of_pirate_and_robot(start_engine, uris)
    with controller.track("pirate"):  # robot (loaded last) has served nothing yet
        pass
    await controller.load(_load("chef", uris["chef"]))
    expected = {"robot": _id("robot"), "chef": _id("chef")}
    assert await _cards(etcd, namespace) == expected
    assert _held(engine) == expected


async def test_every_slot_pinned_or_busy_is_a_capacity_error_that_changes_nothing(
    start_engine: Any, etcd: EtcdClient, namespace: str, uris: dict[str, str]
) -> None:
    engine, controller = await _full_of_pirate_and_robot(start_engine, uris)
    controller.assign({"pirate": Assignment(placed=True, pinned=True)})
    with controller.track("robot"), pytest.raises(CapacityError, match="pinned or busy"):
        await controller.load(_load("chef", uris["chef"]))
    before = {"pirate": _id("pirate"), "robot": _id("robot")}
    assert await _cards(etcd, namespace) == before and _held(engine) == before


async def test_a_load_finding_the_only_slot_taken_by_a_load_under_way_waits_for_it(
    start_engine: Any, etcd: EtcdClient, namespace: str, uris: dict[str, str]
) -> None:
    engine = await start_engine(max_loras=1, engine_class=GatedMocker)
    controller = _controller(engine)
    watched = controller.eviction = WatchedEviction(controller.records, controller.demand)
    robot = asyncio.create_task(controller.load(_load("robot", uris["robot"])))
    await engine.adding.wait()  # robot holds the one slot, its lock held, not loaded yet
    chef = asyncio.create_task(controller.load(_load("chef", uris["chef"])))
    waiting = asyncio.create_task(watched.waited.wait())
    async with asyncio.timeout(30):
        await asyncio.wait({chef, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    assert not chef.done(), chef.exception()  # on its way, not a 429 naming robot's slot

    engine.gate.set()
    loaded = await asyncio.gather(robot, chef)

    assert [answer.lora_name for answer in loaded] == ["robot", "chef"]
    assert _held(engine) == await _cards(etcd, namespace) == {"chef": _id("chef")}


async def test_concurrent_loads_never_hold_more_adapters_than_slots(
    start_engine: Any, etcd: EtcdClient, namespace: str, uris: dict[str, str]
) -> None:
    engine = await start_engine(max_loras=2, add_adapter_delay_s=0.05)  # the adds overlap
    controller = _controller(engine)
    names = ["pirate", "robot", "chef", COLLIDING[0]]
    results = await asyncio.gather(
        *(controller.load(_load(name, uris[name])) for name in names), return_exceptions=True
    )
    assert all(not isinstance(r, BaseException) or isinstance(r, CapacityError) for r in results)
    assert engine.peak <= 2
    assert await _cards(etcd, namespace) == controller.list().loras == _held(engine)


async def test_a_failed_add_frees_its_slot_and_publishes_nothing(
    start_engine: Any, etcd: EtcdClient, namespace: str, uris: dict[str, str]
) -> None:
    engine = await start_engine(max_loras=1, fail_add_adapter="broken.*")
    controller = _controller(engine)
    with pytest.raises(UpstreamError, match="broken1"):
        await controller.load(_load("broken1", uris["broken1"]))
    assert await _cards(etcd, namespace) == {}
    await controller.load(_load("pirate", uris["pirate"]))
    assert _held(engine) == {"pirate": _id("pirate")}


async def test_a_name_whose_lora_id_is_taken_is_a_conflict_that_evicts_nothing(
    start_engine: Any, etcd: EtcdClient, namespace: str, uris: dict[str, str]
) -> None:
    first, second = COLLIDING
    assert _id(first) == _id(second)
    engine = await start_engine(max_loras=1)  # the one slot is full: eviction would be possible
    controller = _controller(engine)
    await controller.load(_load(first, uris[first]))
    with pytest.raises(ConflictError, match=rf"lora_id {_id(first)}.*{first!r}"):
        await controller.load(_load(second, uris[second]))
    assert await _cards(etcd, namespace) == {first: _id(first)}


async def test_loading_again_is_idempotent_but_another_uri_conflicts(
    start_engine: Any, uris: dict[str, str]
) -> None:
    controller = _controller(await start_engine())
    await controller.load(_load("pirate", uris["pirate"]))
    again = await controller.load(_load("pirate", uris["pirate"]))
    assert "is already loaded with these weights" in again.message
    with pytest.raises(ConflictError, match="unload it"):
        await controller.load(_load("pirate", uris["robot"]))


async def test_bad_names_and_unknown_adapters_are_refused_by_the_controller(
    start_engine: Any, uris: dict[str, str]
) -> None:
    controller = _controller(await start_engine())
    with pytest.raises(InvalidRequestError, match="base model"):
        await controller.load(_load("demo", uris["pirate"]))
    with pytest.raises(NotFoundError, match="'ghost' is not loaded"):
        await controller.unload(UnloadLoraRequest(lora_name="ghost"))
