"""The LoRA lifecycle, once for every engine: validate, lock, resolve, add, publish, roll back.

Invariant: a card is in etcd exactly when its adapter is loaded in the engine.
Load adds to the engine, then publishes; a failed publish removes it again.
Unload retracts first, then removes; a failed removal publishes again.
The controller is the one ledger of adapters: it owns the slots (``max_loras``
of the base card), the ids and their collisions, and eviction. Engines supply
only ``add_adapter``/``remove_adapter`` (``AdapterBackend``) and keep a name to
handle map; callers in the worker pass typed requests, and the engine registry
converts them from and to the wire. When a load needs a slot, eviction takes the
adapter the fleet asks least for (``FleetDemand``; least recently used breaks
ties; one loaded within ``in_use_s`` that has served nothing yet goes last), never a
pinned or busy one, nor the last warm copy of one in use (fleet demand of at least
``IN_USE_RPS`` and a request served here within the last ``in_use_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, TypeAlias

import msgspec
import structlog

from lorafleet.fleet.placement import IN_USE_RPS
from lorafleet.proto.adapters import (
    ListLorasRequest,
    LoadLoraRequest,
    LoraListResponse,
    LoraResponse,
    UnloadLoraRequest,
    validate_lora_name,
)
from lorafleet.proto.discovery import LoraInfo, ModelDeploymentCard
from lorafleet.proto.errors import (
    CapacityError,
    ConflictError,
    InvalidRequestError,
    LorafleetError,
    NotFoundError,
)
from lorafleet.proto.limits import shorten
from lorafleet.proto.naming import lora_id, lora_slug
from lorafleet.proto.uris import split_uri
from lorafleet.worker import metrics
from lorafleet.worker.demand import DemandMeter
from lorafleet.worker.engine import AdapterBackend, EngineRoute, ModelEndpoint
from lorafleet.worker.lora import redact_uri

__all__ = ["AdapterSource", "ChangeListener", "FleetDemand", "LoadedAdapter", "LoraController"]

log = structlog.get_logger(__name__)

IN_USE_S: Final = 2.0
"""An adapter with demand that served a request (or loaded) this recently is "in use": its
last warm copy is never evicted (``--lora-in-use-s``)."""

ChangeListener: TypeAlias = Callable[[], None]
"""Called when the loaded or loading adapters, or the requests in flight, change."""


class FleetDemand(Protocol):
    """What eviction needs to know about the fleet (the worker's placement answers it)."""

    def demand_rps(self, name: str) -> float:
        """Requests per second for ``name`` across the fleet, recently."""
        ...

    def copies(self, name: str) -> int:
        """Live instances holding ``name`` now (this one included)."""
        ...


class AdapterSource(Protocol):
    """What the lifecycle needs from the LoRA manager: resolve a URI to a local directory."""

    def supported_schemes(self) -> frozenset[str]:
        """URI schemes that can be loaded."""
        ...

    async def acquire(self, uri: str) -> Path:
        """Download (or find cached) and mark in use by a loaded adapter."""
        ...

    def release(self, uri: str) -> None:
        """The adapter from ``uri`` was unloaded; its cache entry may be evicted."""
        ...


@dataclass
class LoadedAdapter:
    """An adapter in the engine, and whether its card is in etcd."""

    card: ModelDeploymentCard
    uri: str
    published: bool = False

    @property
    def lora_id(self) -> int:
        """vLLM's ``lora_int_id`` of this adapter."""
        assert self.card.lora is not None
        return self.card.lora.lora_id


class LoraController:
    """Serves ``load_lora``, ``unload_lora`` and ``list_loras`` for one engine, within its slots.

    Example::

        controller = LoraController(backend=engine, endpoint=endpoint, source=manager,
                                    base_card=engine.base_card())
        await controller.load(LoadLoraRequest(lora_name="pirate", source=LoraSource(uri=uri)))
    """

    def __init__(
        self,
        *,
        backend: AdapterBackend,
        endpoint: ModelEndpoint,
        source: AdapterSource,
        base_card: ModelDeploymentCard,
    ) -> None:
        self._backend = backend
        self._endpoint = endpoint
        self._source = source
        self._base_card = base_card
        self._max_loras = base_card.runtime_config.max_loras
        self.loaded: dict[str, LoadedAdapter] = {}
        self._adding: set[str] = set()
        """Names holding a slot while the engine adds them (not yet in ``loaded``)."""
        self.pinned: set[str] = set()
        """Adapters never evicted to make room (the fleet's ``pinned`` desired state)."""
        self.placed: set[str] = set()
        """Adapters placement chose this instance for: evicted only after the others."""
        self.loading: set[str] = set()
        """Adapters whose load runs now (download or engine add; no card yet)."""
        self.demand = DemandMeter()
        """This worker's request rates per adapter (published in its load record)."""
        self.fleet: FleetDemand | None = None
        """The fleet's demand and copies; without it eviction sees this worker alone."""
        self.in_use_s: float = IN_USE_S
        """An adapter used this recently is "in use": its last warm copy is not evicted."""
        self.on_change: ChangeListener = lambda: None
        self._locks: dict[str, asyncio.Lock] = {}
        self._last_used: dict[str, float] = {}
        self._unserved: set[str] = set()
        """Loaded adapters that have not served a request since: their first is on its way."""
        self._busy: Counter[str] = Counter()
        self._observe_slots()

    @contextlib.contextmanager
    def track(self, model: str) -> Iterator[None]:
        """Mark ``model`` busy while a request runs; busy adapters are never evicted."""
        self._busy[model] += 1
        self._last_used[model] = time.monotonic()
        self._unserved.discard(model)
        if model in self.loaded:
            self.demand.record(model)
        self.on_change()
        try:
            yield
        finally:
            self._busy[model] -= 1
            self._last_used[model] = time.monotonic()
            self.on_change()

    @property
    def base_model(self) -> str:
        """The base model's name (its card's ``display_name``)."""
        return self._base_card.display_name

    @property
    def max_loras(self) -> int:
        """Adapter slots: adapters loaded or loading at once."""
        return self._max_loras

    @property
    def in_flight(self) -> int:
        """Requests being served now (base model and adapters)."""
        return sum(self._busy.values())

    def idle_s(self, name: str) -> float:
        """Seconds since ``name`` was loaded or last served a request; 0 while busy."""
        if self._busy[name]:
            return 0.0
        return time.monotonic() - self._last_used.get(name, 0.0)

    def routes(self) -> dict[str, EngineRoute[Any]]:
        """The engine updates this controller serves, with the body each one decodes."""
        return {
            "load_lora": EngineRoute(LoadLoraRequest, self.load),
            "unload_lora": EngineRoute(UnloadLoraRequest, self.unload),
            "list_loras": EngineRoute(ListLorasRequest, self._list_route),
        }

    async def load(self, request: LoadLoraRequest) -> LoraResponse:
        """Load and publish an adapter; idempotent for a name loaded from the same URI."""
        name = validate_lora_name(request.lora_name, base_model=self._base_card.display_name)
        uri = self._check_uri(name, request.source.uri)
        with self._loading(name):
            async with self._lock(name):
                started = time.perf_counter()
                with _counted("load", name):
                    message = await self._load_locked(name, uri, request.evict_placed)
                metrics.ADAPTER_LOAD_SECONDS.observe(time.perf_counter() - started)
        self._observe_slots()
        return LoraResponse(
            status="success", message=message, lora_name=name, lora_id=lora_id(name)
        )

    async def unload(self, request: UnloadLoraRequest) -> LoraResponse:
        """Retract and remove an adapter; on a failed removal the card is published again."""
        name = validate_lora_name(request.lora_name, base_model=self._base_card.display_name)
        async with self._lock(name):
            with _counted("unload", name):
                adapter = self._loaded_or_error(name)
                await self._unload_locked(name, adapter)
        self._observe_slots()
        self.on_change()
        return LoraResponse(
            status="success",
            message=f"adapter {name!r} unloaded",
            lora_name=name,
            lora_id=adapter.lora_id,
        )

    @contextlib.contextmanager
    def _loading(self, name: str) -> Iterator[None]:
        """Show ``name`` as loading while its load runs (the load record's ``loading``)."""
        if name not in self.loaded:
            self.loading.add(name)
            self.on_change()
        try:
            yield
        finally:
            self.loading.discard(name)
            self.on_change()

    def _observe_slots(self) -> None:
        """Publish the slots and loaded adapters as metrics (vLLM's ``lora_requests_info``)."""
        model_name = self._base_card.display_name
        metrics.observe_lora_state(model_name, self._max_loras, list(self.loaded))

    def list(self) -> LoraListResponse:
        """Every loaded adapter's name and ``lora_id``."""
        loras = {name: adapter.lora_id for name, adapter in sorted(self.loaded.items())}
        return LoraListResponse(loras=loras, count=len(loras))

    async def _list_route(self, _: ListLorasRequest) -> LoraListResponse:
        return self.list()

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _check_uri(self, name: str, uri: str) -> str:
        shown = shorten(redact_uri(uri))
        parts = split_uri(uri)
        supported = sorted(self._source.supported_schemes())
        if parts is None:
            raise InvalidRequestError(
                f"source.uri {shown!r} of adapter {name!r} is not a URI; use e.g. "
                f"file:///path or s3://bucket/prefix (supported schemes: {supported})",
                lora_name=name,
            )
        if parts[0] not in supported:
            raise InvalidRequestError(
                f"source.uri {shown!r} of adapter {name!r} has unsupported scheme "
                f"{parts[0]!r}; supported: {supported}",
                lora_name=name,
            )
        return uri

    async def _load_locked(self, name: str, uri: str, evict_placed: bool) -> str:
        existing = self.loaded.get(name)
        if existing is not None:
            return await self._reload(name, uri, existing)
        path = await self._source.acquire(uri)
        try:
            await self._add(name, path, evict_placed)
        except BaseException:
            self._source.release(uri)
            raise
        adapter = LoadedAdapter(card=self._adapter_card(name, uri, path), uri=uri)
        self.loaded[name] = adapter
        self._last_used[name] = time.monotonic()
        self._unserved.add(name)
        await self._publish_or_roll_back(name, adapter)
        log.info("adapter loaded", adapter=name, uri=redact_uri(uri), path=str(path))
        return f"adapter {name!r} loaded from {redact_uri(uri)}"

    async def _add(self, name: str, path: Path, evict_placed: bool) -> None:
        """Take a slot for ``name`` and add it to the engine; the slot is freed if that fails."""
        await self._take_slot(name, evict_placed)
        try:
            await self._backend.add_adapter(name, lora_id(name), path)
        finally:
            self._adding.discard(name)

    async def _take_slot(self, name: str, evict_placed: bool) -> None:
        """Reserve a slot, evicting ``eviction_candidate`` while all are taken."""
        while True:
            self._check_id_collision(name)  # again after each await: others may have come
            if len(self.loaded) + len(self._adding) < self._max_loras:
                break
            victim = self.eviction_candidate()
            taken = f"all {self._max_loras} adapter slots are taken by " + str(
                sorted([*self.loaded, *self._adding])
            )
            if victim is None:
                raise CapacityError(
                    f"cannot load adapter {name!r}: every adapter slot is pinned or busy (or the "
                    f"last warm copy of an adapter in use); {taken}; unload one first",
                    lora_name=name,
                )
            if victim in self.placed and not evict_placed:
                raise CapacityError(
                    f"cannot load adapter {name!r} without evicting {victim!r}, which placement "
                    f"chose this instance for, and the load asked to keep placed copies "
                    f"(evict_placed: false); {taken}",
                    lora_name=name,
                )
            log.info("evicting the adapter the fleet asks least for", adapter=victim,
                     for_adapter=name, fleet_demand_rps=self._fleet_demand(victim))  # fmt: skip
            async with self._lock(victim):
                if victim in self.loaded:
                    await self._unload_locked(victim, self.loaded[victim])
        self._adding.add(name)

    def eviction_candidate(self) -> str | None:
        """One that has served since its load before one just loaded, not placed here before
        placed, then the least fleet demand, then least recently used."""
        free = [
            name
            for name in self.loaded
            if name not in self.pinned
            and not self._busy[name]
            and not self._lock(name).locked()
            and not self._last_warm_copy_in_use(name)
        ]
        return min(
            free,
            key=lambda name: (
                self._just_loaded(name), name in self.placed, self._fleet_demand(name),
                self._last_used.get(name, 0.0),
            ),
            default=None,
        )  # fmt: skip

    def _fleet_demand(self, name: str) -> float:
        return self.demand.rate(name) if self.fleet is None else self.fleet.demand_rps(name)

    def _just_loaded(self, name: str) -> bool:
        """Loaded less than ``in_use_s`` ago and no request served since: the requests that
        waited for the load are on their way, so it goes last. A cold adapter has no demand
        yet, and by demand alone it went first (``bench.placement``: evicted 1 ms after its
        load, its requests waited out the frontend's 60 s on-demand timeout)."""
        return name in self._unserved and self.idle_s(name) < self.in_use_s

    def _last_warm_copy_in_use(self, name: str) -> bool:
        """No card on another instance, fleet demand of at least ``IN_USE_RPS``, and a
        request served within ``in_use_s`` (or the load then: its waiting requests are on
        their way). Demand alone is not enough: at 25 req/s over Zipf-distributed adapters
        more adapters pass ``IN_USE_RPS`` than there are slots, and cold loads then found
        no slot at all (``bench.placement``)."""
        copies = 1 if self.fleet is None else self.fleet.copies(name)
        return (
            copies <= 1
            and self.idle_s(name) < self.in_use_s
            and self._fleet_demand(name) >= IN_USE_RPS
        )

    async def _reload(self, name: str, uri: str, existing: LoadedAdapter) -> str:
        if existing.uri != uri:
            raise ConflictError(
                f"adapter {name!r} is already loaded from {redact_uri(existing.uri)}; unload it "
                f"before loading it from {redact_uri(uri)}",
                lora_name=name,
            )
        if existing.published:
            return f"adapter {name!r} is already loaded"
        await self._endpoint.register_model(existing.card)
        existing.published = True
        return f"adapter {name!r} was loaded but not published; published it"

    async def _publish_or_roll_back(self, name: str, adapter: LoadedAdapter) -> None:
        try:
            await self._endpoint.register_model(adapter.card)
        except BaseException as exc:
            await self._roll_back_add(name, adapter, exc)
            raise
        adapter.published = True

    async def _roll_back_add(self, name: str, adapter: LoadedAdapter, cause: BaseException) -> None:
        log.warning("publishing adapter card failed; removing it", adapter=name, error=str(cause))
        try:
            await self._backend.remove_adapter(name)
        except Exception:
            log.exception("rollback failed: adapter stays loaded, unpublished", adapter=name)
            return
        del self.loaded[name]
        self._source.release(adapter.uri)

    async def _unload_locked(self, name: str, adapter: LoadedAdapter) -> None:
        if adapter.published:
            await self._endpoint.unregister_model(adapter.card)
            adapter.published = False
        try:
            await self._backend.remove_adapter(name)
        except BaseException as exc:
            log.warning(
                "removing adapter failed; publishing it again", adapter=name, error=str(exc)
            )
            await self._endpoint.register_model(adapter.card)
            adapter.published = True
            raise
        del self.loaded[name]
        self._last_used.pop(name, None)
        self._unserved.discard(name)
        self._source.release(adapter.uri)
        log.info("adapter unloaded", adapter=name)

    def _loaded_or_error(self, name: str) -> LoadedAdapter:
        adapter = self.loaded.get(name)
        if adapter is None:
            raise NotFoundError(
                f"adapter {name!r} is not loaded; loaded adapters: {sorted(self.loaded)}",
                lora_name=name,
            )
        return adapter

    def _check_id_collision(self, name: str) -> None:
        new_id = lora_id(name)
        for other in [*self.loaded, *self._adding]:
            if lora_id(other) == new_id:
                raise ConflictError(
                    f"adapter {name!r} has lora_id {new_id}, the same as loaded adapter "
                    f"{other!r}; rename one of them",
                    lora_name=name,
                )

    def _adapter_card(self, name: str, uri: str, path: Path) -> ModelDeploymentCard:
        base = self._base_card
        info = LoraInfo(
            name=name, lora_id=lora_id(name), base_model=base.display_name,
            uri=redact_uri(uri), local_path=str(path),
        )  # fmt: skip
        return msgspec.structs.replace(
            base, display_name=name, slug=lora_slug(name), source_path=str(path), lora=info
        )


@contextlib.contextmanager
def _counted(operation: str, name: str) -> Iterator[None]:
    """Count the operation's outcome; errors leaving it name the adapter."""
    try:
        yield
    except LorafleetError as exc:
        metrics.ADAPTER_OPERATIONS.labels(operation, exc.code).inc()
        exc.fields.setdefault("lora_name", name)
        raise
    metrics.ADAPTER_OPERATIONS.labels(operation, "ok").inc()
