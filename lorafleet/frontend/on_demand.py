"""Load a desired adapter that no live instance has, on the least-loaded instance, once.

The instances serving the adapter's base model with LoRA management on (their
base card's ``runtime_config.enable_lora``) whose ``max_lora_rank`` admits the
adapter's rank (``adapter_takers.py``; none: ``AdapterUnplaceableError``, no load
tried; a refusal for its rank teaches it and goes on) are tried with the lifecycle's
``load_lora`` over NATS, carrying the workers' token (``DYN_SYSTEM_AUTH_TOKEN``)
when one is set: one already loading the adapter first, then those with a free
slot, by fewest requests in flight, then the full ones whose eviction costs
least, as their load records say (``FleetLoads``); ties, and instances that
publish no record, keep rendezvous order (the order every worker's placement
uses). Each is first asked to keep placed copies; only when all refuse are the
full ones asked to evict one. Concurrent requests for the same cold adapter
share one load, at most ``queue_limit`` of them (429 beyond); the load runs in
its own task, so a client that gives up does not cancel it. The answer is the
served model once this frontend's registry shows the new card. A load that
fails everywhere is remembered (``LoadFailures``): requests get that failure at
once while it holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

import structlog

from lorafleet.fleet.placement import IN_USE_RPS, LOAD_BOUND_EPS, rendezvous_order
from lorafleet.frontend.adapter_takers import AdapterTakers
from lorafleet.frontend.dispatcher import DispatchSettings
from lorafleet.frontend.errors import (
    AdapterLoadFailedError,
    AdapterUnplaceableError,
    BaseModelUnavailableError,
    InstanceLostError,
    LoadQueueFullError,
    LoadTimeoutError,
    LoadUnauthorizedError,
    WorkerError,
)
from lorafleet.frontend.fleet_loads import FleetLoads
from lorafleet.frontend.load_failures import Failure, LoadFailures, iso_time
from lorafleet.frontend.metrics import FrontendMetrics
from lorafleet.frontend.registry import ModelRegistry, ServedModel
from lorafleet.frontend.request_plane import RequestPlane
from lorafleet.frontend.worker_updates import send_update
from lorafleet.process.auth import bearer_header
from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.adapters import AdapterSpec, LoadLoraRequest
from lorafleet.proto.discovery import Instance
from lorafleet.proto.errors import (
    AdapterRankError,
    CapacityError,
    ErrorInfo,
    LorafleetError,
    UnauthorizedError,
    error_from_info,
)
from lorafleet.proto.inference import UpdateReply, UpdateRequest
from lorafleet.proto.uris import public_uri

__all__ = [
    "DEFAULT_ON_DEMAND_QUEUE",
    "LOAD_UPDATE",
    "OnDemandLoader",
    "TRANSIENT_CODES",
    "TRY_NEXT_CODES",
    "least_loaded_first",
]

log = structlog.get_logger(__name__)

LOAD_UPDATE: Final = "update/load_lora"
TRY_NEXT_CODES: Final = frozenset({"capacity", "not_found", "unavailable"})
"""Load failures another instance may not have: full, no LoRA management, starting up."""
TRANSIENT_CODES: Final = frozenset({"capacity", "unavailable", "shutting_down"})
"""Load failures that say nothing about the adapter: they are not remembered as its failure."""
CARD_SHOWN_S: Final = 5.0
"""How long a loaded adapter's card may take to show before the load is asked for again: a
card evicted at once (put and deleted between two looks at the cache) never shows."""
DEFAULT_ON_DEMAND_QUEUE: Final = 256
"""Requests that may wait for one adapter's load (``--on-demand-queue``); 429 beyond."""


def least_loaded_first(order: list[int], loads: FleetLoads, adapter: str) -> list[int]:
    """``order`` (rendezvous) re-sorted: instances already loading ``adapter`` first (the
    lifecycle's lock makes a second load there wait for the first: no extra copy), then
    those with a free slot, by fewest in flight; instances without a load record go after
    those with room and before the full ones. Full instances come by the adapter their
    worker says it would evict (``InstanceLoad.evicts``): one placement did not put there
    first (placement would load it again), then the least fleet demand, so the load does
    not push out a popular adapter that would be loaded again soon (every adapter below
    ``IN_USE_RPS`` costs alike); full instances where nothing may go come last. Equals
    go by requests in flight, then by requests served lately (the record's demand
    summed), so the tail's loads land on the least busy instances. Instances serving more
    than ``1 + LOAD_BOUND_EPS`` times the mean (bounded loads, as placement) come after
    every other that may take the load: a free slot on the busiest instance would make it
    busier still."""
    records = loads.records()
    loading = set(loads.loading(adapter))
    served = {iid: sum(load.demand.values()) for iid, load in records.items()}
    busy_rps = (1 + LOAD_BOUND_EPS) * sum(served.values()) / (len(served) or 1)

    def rank(instance_id: int) -> tuple[int, int, float, int, float]:
        load = records.get(instance_id)
        if load is None:
            return 0, 2, 0.0, 0, 0.0
        if instance_id in loading:
            return 0, 0, 0.0, 0, 0.0
        served_rps = served[instance_id]
        if load.free_slots == 0 and not load.evicts:
            return 2, 5, 0.0, load.in_flight, served_rps
        over = int(served_rps > busy_rps)
        if load.free_slots > 0:
            return over, 1, 0.0, load.in_flight, served_rps
        victim_rps = max(IN_USE_RPS, loads.demand(load.evicts))  # a trickle costs alike
        return over, 3 + load.evicts_placed, victim_rps, load.in_flight, served_rps

    return sorted(order, key=rank)  # stable: ties keep rendezvous order


class OnDemandLoader:
    """Single-flight on-demand loads of desired adapters, bounded by ``timeout_s``."""

    def __init__(
        self,
        registry: ModelRegistry,
        plane: RequestPlane,
        metrics: FrontendMetrics,
        *,
        loads: FleetLoads,
        failures: LoadFailures,
        timeout_s: float,
        queue_limit: int = DEFAULT_ON_DEMAND_QUEUE,
        settings: DispatchSettings | None = None,
        worker_token: str | None = None,
    ) -> None:
        self._registry = registry
        self._plane = plane
        self._metrics = metrics
        self._fleet = loads
        self.failures = failures
        self.timeout_s = timeout_s
        self.queue_limit = queue_limit
        self._settings = settings or DispatchSettings()
        self._headers = bearer_header(worker_token)
        self.takers = AdapterTakers(registry, loads)
        """Which instances can take each adapter (its rank); ``AdapterStates`` asks too."""
        self._loads: dict[str, asyncio.Task[ServedModel]] = {}
        self._waiting: dict[str, int] = {}

    async def load(self, spec: AdapterSpec, *, retry_failed: bool = False) -> ServedModel:
        """The served adapter after loading it; joins a load of the same name in progress.

        Raises ``AdapterLoadFailedError`` at once while its last failure holds (unless
        ``retry_failed``: an operator's load tries again), and ``LoadQueueFullError`` when
        ``queue_limit`` requests already wait for it.
        """
        held = None if retry_failed else self.failures.holding(spec.name)
        if held is not None:
            raise _failed(spec.name, held)
        waiting = self._waiting.get(spec.name, 0)
        if waiting >= self.queue_limit:
            raise LoadQueueFullError(spec.name, waiting)
        task = self._loads.get(spec.name)
        if task is None:
            task = asyncio.create_task(self._timed_load(spec), name=f"load {spec.name}")
            self._loads[spec.name] = task
            task.add_done_callback(self._forget(spec.name))
        self._waiting[spec.name] = waiting + 1
        try:
            return await asyncio.shield(task)
        finally:
            self._waiting[spec.name] -= 1
            if not self._waiting[spec.name]:
                del self._waiting[spec.name]

    async def aclose(self) -> None:
        """Cancel the loads in progress (their workers finish or roll back by themselves)."""
        await cancel_and_wait(*self._loads.values())

    @property
    def loading(self) -> list[str]:
        """Names of the adapters being loaded right now."""
        return sorted(self._loads)

    def is_loading(self, name: str) -> bool:
        """Whether this frontend loads adapter ``name`` right now."""
        return name in self._loads

    def _forget(self, name: str) -> Callable[[asyncio.Task[ServedModel]], None]:
        def forget(task: asyncio.Task[ServedModel]) -> None:
            if self._loads.get(name) is task:
                del self._loads[name]
            if not task.cancelled():
                task.exception()  # retrieved: a load nobody waits for any more logs no warning

        return forget

    async def _timed_load(self, spec: AdapterSpec) -> ServedModel:
        started = time.perf_counter()
        outcome = "ok"
        try:
            async with asyncio.timeout(self.timeout_s):
                served = await self._load_somewhere(spec)
            self.failures.forget(spec.name)
            return served
        except WorkerError as exc:
            outcome = exc.error.code
            if outcome in TRANSIENT_CODES:
                raise
            raise self._remember(spec.name, exc) from exc
        except TimeoutError as exc:
            outcome = "timeout"
            raise LoadTimeoutError(spec.name, self.timeout_s) from exc
        except LorafleetError as exc:
            outcome = _code(exc)
            raise
        finally:
            elapsed_s = time.perf_counter() - started
            self._metrics.on_demand_load(outcome, elapsed_s)
            log.info("on-demand load", adapter=spec.name, outcome=outcome, seconds=elapsed_s)

    def _remember(self, adapter: str, exc: WorkerError) -> AdapterLoadFailedError:
        """Hold the adapter's failure (logged once: requests meanwhile get it unlogged)."""
        failure = self.failures.remember(adapter, exc.instance_id, exc.error)
        log.warning("on-demand load failed", adapter=adapter, code=exc.error.code,
                    instance=f"{exc.instance_id:x}", error=exc.error.message)  # fmt: skip
        return _failed(adapter, failure)

    async def _load_somewhere(self, spec: AdapterSpec) -> ServedModel:
        """Load the adapter until its card shows (the caller's timeout bounds the tries)."""
        while True:
            instance_id = await self._load_on_one(spec)
            served = await self._served_on(spec.name, instance_id)
            if served is not None:
                return served
            log.warning("loaded adapter's card did not show; loading it again",
                        adapter=spec.name, instance=f"{instance_id:x}",
                        waited_s=CARD_SHOWN_S)  # fmt: skip

    async def _load_on_one(self, spec: AdapterSpec) -> int:
        """Try the base model's instances, least loaded first, until one loads the adapter:
        first asking each to keep its placed copies, then the full ones to evict one."""
        base = self._registry.get(spec.base_model)
        if base is None or base.parent is not None:
            raise BaseModelUnavailableError(spec.name, spec.base_model)
        self._raise_if_unplaceable(spec)
        takers = set(self.takers.takers(spec))  # loads adapters, and admits its rank
        by_id = {i.instance_id: i for i in base.instances if i.instance_id in takers}
        order = least_loaded_first(rendezvous_order(spec.name, by_id), self._fleet, spec.name)
        last: LorafleetError | None = None
        full: list[int] = []
        for evict_placed, instances in ((False, order), (True, full)):
            for instance_id in instances:
                if instance_id not in self.takers.takers(spec):
                    continue  # a refusal since taught us its rank is too large here
                try:
                    await self._load_on(by_id[instance_id], spec, evict_placed=evict_placed)
                except InstanceLostError as exc:
                    last = exc
                except WorkerError as exc:
                    last = self._next_or_raise(spec, instance_id, exc)
                    if exc.error.code == CapacityError.code and not evict_placed:
                        full.append(instance_id)
                else:
                    return instance_id
                log.info("on-demand load goes to the next instance", adapter=spec.name,
                         instance=f"{instance_id:x}", reason=last.message)  # fmt: skip
        self._raise_if_unplaceable(spec)  # every instance refused it for its rank
        raise last or BaseModelUnavailableError(spec.name, spec.base_model)

    def _raise_if_unplaceable(self, spec: AdapterSpec) -> None:
        """No load at all when no live instance can take ``spec`` (its rank): say why."""
        reason = self.takers.unplaceable(spec)
        if reason:
            raise AdapterUnplaceableError(spec.name, reason)

    def _next_or_raise(self, spec: AdapterSpec, instance_id: int, exc: WorkerError) -> WorkerError:
        """``exc`` when another instance may load ``spec`` (and a refusal for its rank
        learned); raise it when no other can."""
        if exc.error.code == AdapterRankError.code:
            self.takers.refused(spec, instance_id)
        elif exc.error.code not in TRY_NEXT_CODES:
            raise exc
        return exc

    async def _load_on(self, instance: Instance, spec: AdapterSpec, *, evict_placed: bool) -> None:
        """Ask ``instance`` to load ``spec``; raises ``WorkerError`` or ``InstanceLostError``."""
        load = LoadLoraRequest(lora_name=spec.name, source=spec.source, evict_placed=evict_placed)
        update = UpdateRequest.of(LOAD_UPDATE, load)
        answer = await send_update(
            self._plane, instance, update, headers=self._headers, settings=self._settings
        )
        error = _error_of(answer, spec)
        if error is None:
            return
        if error.code == UnauthorizedError.code:
            log.error("worker refused this frontend's token", instance=f"{instance.instance_id:x}",
                      hint="set DYN_SYSTEM_AUTH_TOKEN to the workers' token")  # fmt: skip
            raise LoadUnauthorizedError(spec.name, instance.instance_id)
        raise WorkerError(instance.instance_id, error)

    async def _served_on(self, name: str, instance_id: int) -> ServedModel | None:
        """The served adapter once the registry shows ``name``'s card on ``instance_id`` (the
        worker put it); None when it does not within ``CARD_SHOWN_S``."""

        def shown(_cards: object) -> bool:
            served = self._registry.get(name)
            return served is not None and any(
                instance.instance_id == instance_id for instance in served.instances
            )

        try:
            await self._registry.card_cache.wait_until(shown, CARD_SHOWN_S)
        except TimeoutError:
            return None
        served = self._registry.get(name)
        assert served is not None
        return served


def _error_of(answer: UpdateReply, spec: AdapterSpec) -> LorafleetError | None:
    """The worker's error (None on success) as the chat client may see it: a source error's
    reason beside the public form of the URI, never the worker's paths or operator's hint."""
    info = answer.error
    if info is None and answer.status_code == 200:
        return None
    if info is None:  # a worker from before typed errors: its status is all we trust
        info = ErrorInfo(
            code="upstream_error", message=f"load_lora answered HTTP {answer.status_code}"
        )
    if info.reason:
        info = ErrorInfo(
            code=info.code, message=f"LoRA source {public_uri(spec.source.uri)}: {info.reason}"
        )
    return error_from_info(info)


def _failed(adapter: str, failure: Failure) -> AdapterLoadFailedError:
    return AdapterLoadFailedError(adapter, failure.describe(), iso_time(failure.hold_until))


def _code(exc: LorafleetError) -> str:
    return exc.error.code if isinstance(exc, WorkerError) else exc.code
