"""The LoRA lifecycle, once for every engine: validate, lock, fetch, add, publish, swap, roll back.

Invariant: a card is in etcd exactly when its adapter is loaded in the engine, and the card's
digest is the digest of the version new requests go to. Load adds to the engine, then
publishes; a failed publish removes it again. A load of a loaded name with other weights
(``replace``, vLLM's ``load_inplace``, a changed source or changed files) is a make-before-break
swap: the new version is added beside the old one and its card replaces the old card in one
put; a failed step leaves the old version serving and names the step. A version leaves (a
swap's old one, unload, eviction) one way, ``VersionSteps.drain_and_remove``: card replaced or
retracted, drained, then removed; a failed removal publishes again. One :class:`AdapterRecord`
per name (``worker.adapter_record``); the controller owns the slots (``max_loras``), ids and
eviction (``worker.eviction``). Engines supply ``add_adapter``/``remove_adapter`` by version key.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import structlog

from lorafleet.fleet.kv_blocks import version_key
from lorafleet.proto.adapters import (
    ListLorasRequest,
    LoadLoraRequest,
    LoraListResponse,
    LoraResponse,
    UnloadLoraRequest,
    expected_digest,
    validate_lora_name,
)
from lorafleet.proto.discovery import ModelDeploymentCard
from lorafleet.proto.errors import (
    ConflictError,
    InvalidRequestError,
    LorafleetError,
    NotFoundError,
)
from lorafleet.proto.fleet_load import EvictedAdapter
from lorafleet.proto.limits import shorten
from lorafleet.proto.uris import split_uri
from lorafleet.worker import metrics
from lorafleet.worker.adapter_record import AdapterRecord, AdapterVersion, Phase, Role
from lorafleet.worker.base_model_check import BaseModelPolicy
from lorafleet.worker.demand import DemandMeter
from lorafleet.worker.engine import AdapterBackend, EngineRoute, ModelEndpoint
from lorafleet.worker.eviction import IN_USE_S, Eviction, FleetDemand
from lorafleet.worker.lora import redact_uri
from lorafleet.worker.version_steps import AdapterSource, VersionSteps, step

__all__ = [
    "AdapterSource", "Assignment", "ChangeListener", "EvictionListener", "IN_USE_S",
    "LoraController",
]  # fmt: skip

log = structlog.get_logger(__name__)

ChangeListener: TypeAlias = Callable[[], None]
"""Called when the loaded or loading adapters, or the requests in flight, change."""
EvictionListener: TypeAlias = Callable[[], Awaitable[None]]
"""Awaited when an unmanaged adapter is about to be evicted, before its card is retracted
(the load report writes ``evicted`` then, so a frontend that sees the card go sees why)."""


async def _nothing() -> None:
    pass


@dataclass(frozen=True, kw_only=True)
class Assignment:
    """Placement's word on one desired adapter of this base model."""

    placed: bool
    """The fleet-wide plan puts it on this instance."""
    pinned: bool = False
    """The desired state pins it: a copy placed here is never evicted."""


class LoraController:
    """Serves ``load_lora``, ``unload_lora`` and ``list_loras`` for one engine, within its slots.

    Example::

        controller = LoraController(backend=engine, endpoint=endpoint, source=manager,
                                    base_card=card, base_check=policy, drain_timeout_s=30)
        await controller.load(LoadLoraRequest(lora_name="pirate", source=LoraSource(uri=uri)))
    """

    def __init__(
        self,
        *,
        backend: AdapterBackend,
        endpoint: ModelEndpoint,
        source: AdapterSource,
        base_card: ModelDeploymentCard,
        base_check: BaseModelPolicy,
        drain_timeout_s: float,
    ) -> None:
        self._steps = VersionSteps(
            backend=backend, endpoint=endpoint, source=source, base_card=base_card,
            base_check=base_check, drain_timeout_s=drain_timeout_s,
        )  # fmt: skip
        self._endpoint = endpoint
        self._base_card = base_card
        self._max_loras = base_card.runtime_config.max_loras
        self.records: dict[str, AdapterRecord] = {}
        """Every adapter this worker holds, loads, or was evicted from holding (by name)."""
        self._plan: Mapping[str, Assignment] = {}
        self.demand = DemandMeter()
        """This worker's request rates per adapter (published in its load record)."""
        self.eviction = Eviction(self.records, self.demand)
        self.on_change: ChangeListener = lambda: None
        self.on_evict: EvictionListener = _nothing
        self._observe_slots()

    def attach_fleet(
        self, fleet: FleetDemand | None, *, demand: DemandMeter | None = None,
        in_use_s: float = IN_USE_S,
    ) -> None:  # fmt: skip
        """Let eviction weigh the fleet's demand and copies (placement calls this once)."""
        if demand is not None:
            self.demand = demand
        self.eviction = Eviction(self.records, self.demand, fleet=fleet, in_use_s=in_use_s)

    def assign(self, plan: Mapping[str, Assignment]) -> None:
        """Placement's plan for the desired adapters of this base model: roles and pins."""
        self._plan = plan
        for record in self.records.values():
            self._apply_plan(record)

    def _apply_plan(self, record: AdapterRecord) -> None:
        assignment = self._plan.get(record.name)
        record.pinned = assignment is not None and assignment.placed and assignment.pinned
        if assignment is not None:
            record.role = Role.PLACED if assignment.placed else Role.DECLARED
        elif record.role is not Role.UNMANAGED:
            record.role = Role.DELETED

    @contextlib.contextmanager
    def track(self, model: str) -> Iterator[None]:
        """Count a request on the version serving ``model`` now (a busy version is never
        evicted, and one leaving the engine waits for it, up to the drain timeout); any
        request's start and end changes the load record (``in_flight``, demand)."""
        record = self.records.get(model)
        version = record.serving if record is not None else None
        if record is not None and version is not None:
            version.busy += 1
            record.last_used, record.unserved = time.monotonic(), False
            self.demand.record(model)
        self.on_change()
        try:
            yield
        finally:
            if record is not None and version is not None:
                version.busy -= 1
                record.last_used = time.monotonic()
            self._steps.request_ended()
            self.on_change()

    def engine_key(self, model: str) -> str | None:
        """The engine's key of the version serving adapter ``model``; None if none is."""
        record = self.records.get(model)
        version = record.serving if record is not None else None
        return version.key if version is not None else None

    def kv_version(self, key: str) -> str:
        """The fleet's name of the version the engine holds under ``key`` (its KV blocks'
        ``fleet.kv_blocks.version_key``); ``key`` itself for a key no record holds."""
        for record in self.records.values():
            for version in record.versions:
                if version.key == key:
                    return version_key(version.name, version.digest)
        return key

    @property
    def base_model(self) -> str:
        """The base model's name (its card's ``display_name``)."""
        return self._base_card.display_name

    @property
    def max_loras(self) -> int:
        """Adapter slots: adapter versions loaded or being added at once."""
        return self._max_loras

    @property
    def max_lora_rank(self) -> int:
        """The largest adapter rank the engine takes (its card's; 0: it says none)."""
        return self._base_card.runtime_config.max_lora_rank

    @property
    def loaded(self) -> list[str]:
        """Names of the adapters that serve requests now, sorted."""
        return sorted(name for name, r in self.records.items() if r.serving is not None)

    @property
    def loading(self) -> list[str]:
        """Names of the adapters with a version on its way in, sorted."""
        return sorted(name for name, record in self.records.items() if record.loading)

    @property
    def in_flight(self) -> int:
        """Requests being served now, base model and adapters: the endpoint's count."""
        return self._endpoint.inflight

    def idle_s(self, name: str) -> float:
        """Seconds since ``name`` was loaded or last served a request; 0 while busy."""
        record = self.records.get(name)
        return 0.0 if record is None else record.idle_s(time.monotonic())

    def eviction_candidate(self) -> str | None:
        """The adapter a load would evict now (``worker.eviction``), None if none may go."""
        return self.eviction.candidate()

    def evicted(self) -> dict[str, EvictedAdapter]:
        """The unmanaged adapters eviction took here and no load brought back, by name."""
        return {
            name: EvictedAdapter(
                base_model=self.base_model,
                uri=record.source,
                digest=record.digest,
                at=record.evicted_at,
                reason=record.evicted_reason,
            )
            for name, record in sorted(self.records.items())
            if record.evicted_at and record.role is Role.UNMANAGED
        }

    def is_placed(self, name: str) -> bool:
        """Whether placement's plan puts ``name`` on this instance."""
        record = self.records.get(name)
        return record is not None and record.role is Role.PLACED

    def routes(self) -> dict[str, EngineRoute[Any]]:
        """The engine updates this controller serves, with the body each one decodes."""
        return {
            "load_lora": EngineRoute(LoadLoraRequest, self.load),
            "unload_lora": EngineRoute(UnloadLoraRequest, self.unload),
            "list_loras": EngineRoute(ListLorasRequest, self._list_route),
        }

    async def load(self, request: LoadLoraRequest) -> LoraResponse:
        """Load and publish an adapter, or swap a loaded one to other weights (make before
        break); a no-op for the same weights."""
        name = validate_lora_name(request.lora_name, base_model=self._base_card.display_name)
        uri = self._check_uri(name, request.source.uri)
        record = await self._locked_record(name, uri)
        try:
            started = time.perf_counter()
            with _counted("load", name):
                message, warnings = await self._load_locked(record, uri, request)
            metrics.ADAPTER_LOAD_SECONDS.observe(time.perf_counter() - started)
        finally:
            record.lock.release()
            self._forget_if_empty(record)
            self._observe_slots()
            self.on_change()
        serving = record.serving
        assert serving is not None
        return LoraResponse(status="success", message=message, lora_name=name,
                            lora_id=serving.lora_id, digest=serving.digest,
                            warnings=[*warnings])  # fmt: skip

    async def unload(self, request: UnloadLoraRequest) -> LoraResponse:
        """Retract, drain and remove an adapter, then answer; a failed removal publishes again."""
        name = validate_lora_name(request.lora_name, base_model=self._base_card.display_name)
        record = self.records.get(name)
        serving = record.serving if record is not None else None
        if record is None or serving is None:
            raise NotFoundError(
                f"adapter {name!r} is not loaded; loaded adapters: {self.loaded}", lora_name=name
            )
        async with record.lock:
            with _counted("unload", name):
                if record.serving is None or self.records.get(name) is not record:
                    raise NotFoundError(f"adapter {name!r} was unloaded meanwhile")
                cut = await self._steps.remove_all(record)
            del self.records[name]
        self._observe_slots()
        self.on_change()
        ended = f"{cut} request(s) outlasting the drain ended" if cut else "its requests finished"
        message = f"adapter {name!r} unloaded once drained ({ended})"
        return LoraResponse(status="success", message=message, lora_name=name,
                            lora_id=serving.lora_id, digest=serving.digest)  # fmt: skip

    async def _locked_record(self, name: str, uri: str) -> AdapterRecord:
        """The record of ``name`` (new if none), locked; an unload that removed it while
        this waited for its lock leaves a new one to take."""
        while True:
            record = self.records.get(name)
            if record is None:
                record = self.records[name] = AdapterRecord(name=name, source=uri)
                self._apply_plan(record)
            await record.lock.acquire()
            if self.records.get(name) is record:
                return record
            record.lock.release()

    def list(self) -> LoraListResponse:
        """Every serving adapter's name, ``lora_id`` and digest."""
        serving = {name: record.serving for name, record in sorted(self.records.items())}
        live = {name: version for name, version in serving.items() if version is not None}
        return LoraListResponse(
            loras={name: version.lora_id for name, version in live.items()},
            count=len(live),
            digests={name: version.digest for name, version in live.items()},
        )

    async def _list_route(self, _: ListLorasRequest) -> LoraListResponse:
        return self.list()

    def _observe_slots(self) -> None:
        """Publish the slots and loaded adapters as metrics (vLLM's ``lora_requests_info``)."""
        metrics.observe_lora_state(self._base_card.display_name, self._max_loras, self.loaded)

    def _forget_if_empty(self, record: AdapterRecord) -> None:
        """Drop a record that never held a version (a first load that failed)."""
        if (
            not record.versions
            and not record.last_digest
            and self.records.get(record.name) is record
        ):
            del self.records[record.name]

    def _check_uri(self, name: str, uri: str) -> str:
        shown = shorten(redact_uri(uri))
        parts = split_uri(uri)
        supported = sorted(self._steps.source.supported_schemes())
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

    async def _load_locked(
        self, record: AdapterRecord, uri: str, request: LoadLoraRequest
    ) -> tuple[str, Sequence[str]]:
        """The load's message and warnings."""
        old = record.serving
        if old is not None and old.uri != uri and not request.replace:
            raise ConflictError(
                f"adapter {record.name!r} is already loaded from {redact_uri(old.uri)}; swap it "
                f"with replace: true (vLLM: load_inplace) or unload it before loading it from "
                f"{redact_uri(uri)}",
                lora_name=record.name,
            )
        new = AdapterVersion(name=record.name, uri=uri, expected=expected_digest(request.source))
        record.versions.append(new)
        try:
            refresh = request.replace or old is not None  # a reload: S3 may hold new objects
            await step("fetch", old, self._steps.fetch(new, refresh=refresh))
            if old is not None and new.digest == old.digest:
                return await self._same_weights(record, old, new), old.warnings
            await step("slot", old, self._take_slot(new, request.evict_placed))
            await step("add", old, self._steps.add(new))
            await step("publish", old, self._steps.publish(record, new))
        except BaseException:
            await self._steps.discard(record, new)
            raise
        record.source, record.unserved, record.last_used = uri, True, time.monotonic()
        record.evicted_at, record.evicted_reason = 0.0, ""
        if old is None:
            log.info("adapter loaded", adapter=record.name, uri=redact_uri(uri), digest=new.digest)
            message = f"adapter {record.name!r} loaded from {redact_uri(uri)} ({new.digest})"
            return message, new.warnings
        await self._steps.retire(record, old)
        log.info("adapter swapped", adapter=record.name, old=old.digest, new=new.digest)
        return f"adapter {record.name!r} swapped from {old.digest} to {new.digest}", new.warnings

    async def _same_weights(
        self, record: AdapterRecord, old: AdapterVersion, new: AdapterVersion
    ) -> str:
        """The asked-for weights are the ones serving: nothing changes (a lost publish is
        retried)."""
        self._steps.source.release(new.uri)
        record.versions.remove(new)
        if old.phase is Phase.LOADED:
            await self._steps.publish(record, old)
            return f"adapter {record.name!r} was loaded but not published; published it"
        return (
            f"adapter {record.name!r} is already loaded with these weights ({old.digest}); "
            "nothing changed"
        )

    async def _take_slot(self, version: AdapterVersion, evict_placed: bool) -> None:
        """Reserve a slot, evicting ``Eviction.candidate`` while all are taken; while none may
        go and another load holds a slot on its way in, wait for that load's outcome first."""
        while True:
            self._check_id_collision(version)  # again after each await: others may have come
            if sum(record.slots for record in self.records.values()) < self._max_loras:
                break
            under_way = self.eviction.load_under_way(version.name)
            if under_way is not None and self.eviction.candidate() is None:
                log.info("every slot is taken; waiting for the load under way",
                         adapter=version.name, loading=under_way.name)  # fmt: skip
                async with under_way.lock:  # loaded (a candidate, maybe) or undone (a free slot)
                    continue
            victim = self.eviction.victim_for(version.name, self._max_loras, evict_placed)
            log.info("evicting the adapter the fleet asks least for", adapter=victim.name,
                     for_adapter=version.name)  # fmt: skip
            async with victim.lock:
                if victim.serving is not None:
                    await self._evict(victim, for_adapter=version.name)
        version.enter(Phase.RESERVED)

    async def _evict(self, victim: AdapterRecord, *, for_adapter: str) -> None:
        """Remove every version of ``victim``, saying so in the load record before its card
        goes (an unmanaged adapter is then loaded back on demand, never a 404)."""
        taker = self.records[for_adapter]
        victim.evicted_at = time.time()
        victim.evicted_reason = f"its slot went to {taker.role.value} adapter {for_adapter!r}"
        if victim.role is Role.UNMANAGED:
            await self.on_evict()
        try:
            await self._steps.remove_all(victim)
        except BaseException:
            victim.evicted_at, victim.evicted_reason = 0.0, ""  # it serves again
            raise
        log.info("adapter evicted; its record keeps source and digest", adapter=victim.name,
                 role=victim.role.value, reason=victim.evicted_reason)  # fmt: skip

    def _check_id_collision(self, version: AdapterVersion) -> None:
        for record in self.records.values():
            for other in record.versions:
                if other is not version and other.holds_slot and other.lora_id == version.lora_id:
                    raise ConflictError(
                        f"adapter {version.name!r} has lora_id {version.lora_id}, the same as "
                        f"loaded adapter {other.name!r}; rename one of them",
                        lora_name=version.name,
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
