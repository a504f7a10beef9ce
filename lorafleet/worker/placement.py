"""Fleet placement inside one worker: load what the fleet-wide plan gives it, unload the rest.

Each worker watches the desired state (``v1/adapters/{ns}/``), the cards of its
peers (``v1/mdc/{ns}/``), their load records (``v1/load/{ns}/``) and the copies that
adapters' missed latency targets added (``v1/slo/{ns}/copies/``, ``fleet.slo``), computes
the same plan as every other worker (``fleet.placement.plan_copies``: copies from
fleet demand, rendezvous order with loads bounded by count and by demand, held copies
stay; each adapter only on instances whose ``--max-lora-rank`` admits it,
``fleet.adapter_fit``) and converges by itself; there is no coordinator. Loads and
unloads go through the same ``LoraController`` as the admin routes (locks, publish,
rollback); failed loads back off (``worker.load_retries``); ``worker.load_report``
publishes this worker's slots, demand and failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, TypeAlias

import structlog

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import (
    adapters_prefix,
    card_prefix,
    load_prefix,
    parse_card_key,
    parse_load_key,
    slo_copies_prefix,
)
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.fleet.adapter_fit import RankCache, can_take, least_rank
from lorafleet.fleet.placement import IN_USE_RPS, RendezvousCache, chosen_instances, plan_copies
from lorafleet.fleet.slo import slo_floor
from lorafleet.process.settings import NON_NEGATIVE, POSITIVE, Settings, setting
from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.adapters import (
    AdapterSpec,
    LoadLoraRequest,
    UnloadLoraRequest,
    decode_adapter_spec,
    expected_digest,
    replica_bounds,
)
from lorafleet.proto.discovery import ModelDeploymentCard, RuntimeConfig, decode_card
from lorafleet.proto.errors import (
    AdapterRankError,
    CapacityError,
    LorafleetError,
    UnavailableError,
)
from lorafleet.proto.fleet_load import InstanceLoad, decode_instance_load
from lorafleet.proto.slo import SloCopies, decode_slo_copies
from lorafleet.proto.uris import redact_uri
from lorafleet.worker.adapter_record import Role
from lorafleet.worker.copy_targets import CopyTargets
from lorafleet.worker.demand import DemandMeter
from lorafleet.worker.eviction import IN_USE_S
from lorafleet.worker.load_report import LoadReport
from lorafleet.worker.load_retries import LoadRetries
from lorafleet.worker.lora_controller import Assignment, LoraController

__all__ = ["Placement", "PlacementPolicy", "PlacementSettings"]

log = structlog.get_logger(__name__)

DEBOUNCE_S: Final = 0.05
MIN_PASS_INTERVAL_S: Final = 0.25
"""Passes start at most this often: load records change with every request."""
RECHECK_S: Final = 5.0
"""Re-run placement this often even without changes: unloads idle copies."""


_Caches: TypeAlias = tuple[
    WatchCache[AdapterSpec],
    WatchCache[ModelDeploymentCard],
    WatchCache[InstanceLoad],
    WatchCache[SloCopies],
]
"""What placement follows: desired state, cards, load records, SLO copies."""


async def _watch_all(etcd: EtcdClient, namespace: str) -> _Caches:
    """Start following everything placement reads; an etcd error part-way closes what
    started (the caller may try again)."""
    started: list[WatchCache[Any]] = []
    try:
        for prefix, decode in (
            (adapters_prefix(namespace), decode_adapter_spec),
            (card_prefix(namespace), decode_card),
            (load_prefix(namespace), decode_instance_load),
            (slo_copies_prefix(namespace), decode_slo_copies),
        ):
            started.append(await WatchCache.start(etcd, prefix, decode))
    except Exception:
        await asyncio.gather(*(cache.aclose() for cache in started))
        raise
    specs, cards, loads, slo_copies = started
    return specs, cards, loads, slo_copies


class PlacementPolicy(enum.Enum):
    """How copies are chosen: ``bounded`` (default) or the old ``rendezvous`` (for benchmarks)."""

    BOUNDED = "bounded"
    """Copies from demand between the bounds; rendezvous order skipping full or loaded instances."""
    RENDEZVOUS = "rendezvous"
    """``replicas`` copies (the lower bound) on the first instances of the rendezvous order."""


@dataclass(frozen=True, kw_only=True)
class PlacementSettings(Settings):
    """The worker's placement knobs, declared once with their flags (``--lora-copy-*``).

    Example::

        PlacementSettings()                                  # the defaults
        PlacementSettings(copy_rps=2.0, cooldown_s=1.0)      # tests: copies come and go fast
    """

    policy: PlacementPolicy = setting(
        PlacementPolicy.BOUNDED, flag="--placement-policy", env="DYN_PLACEMENT_POLICY",
        help="bounded: copies from demand, on instances with a free slot and under the load "
        "bound; rendezvous: the old fixed replicas by hash alone (for bench.placement)",
    )  # fmt: skip
    idle_unload_s: float = setting(
        300.0, flag="--lora-idle-unload-s", env="DYN_LORA_IDLE_UNLOAD_S",
        help="seconds idle after which an adapter loaded on demand, and not placed on this "
        "worker, is unloaded",
    )  # fmt: skip
    copy_rps: Annotated[float, POSITIVE] = setting(
        10.0, flag="--lora-copy-rps", env="DYN_LORA_COPY_RPS",
        help="requests/s one adapter copy serves; the fleet adds a copy when demand per copy "
        "passes 70% of it (prefetch)",
    )  # fmt: skip
    cooldown_s: Annotated[float, POSITIVE] = setting(
        120.0, flag="--lora-copy-cooldown-s", env="DYN_LORA_COPY_COOLDOWN_S",
        help="seconds demand must stay below half the threshold for one fewer copy before an "
        "extra copy goes",
    )  # fmt: skip
    demand_half_life_s: Annotated[float, POSITIVE] = setting(
        30.0, flag="--lora-demand-half-life-s", env="DYN_LORA_DEMAND_HALF_LIFE_S",
        help="half-life in seconds of the per-adapter request rates in the load records",
    )  # fmt: skip
    in_use_s: Annotated[float, NON_NEGATIVE] = setting(
        IN_USE_S, flag="--lora-in-use-s", env="DYN_LORA_IN_USE_S",
        help='seconds: an adapter with fleet demand of at least 0.1 req/s that served a request '
        '(or loaded) this recently is "in use", and eviction keeps its last warm copy',
        more="See [`docs/fleet.md`](docs/fleet.md).",
    )  # fmt: skip


class Placement:
    """Keeps this instance's adapters equal to its share of the fleet-wide plan."""

    def __init__(
        self,
        *,
        controller: LoraController,
        instance_id: int,
        specs: WatchCache[AdapterSpec],
        cards: WatchCache[ModelDeploymentCard],
        loads: WatchCache[InstanceLoad],
        slo_copies: WatchCache[SloCopies],
        settings: PlacementSettings,
    ) -> None:
        self._controller = controller
        self._instance_id = instance_id
        self._base_model = controller.base_model
        self._specs = specs
        self._cards = cards
        self._loads = loads
        self._slo_copies = slo_copies
        """The copies adapters' latency targets added (``frontend.slo_loop`` writes them)."""
        self._settings = settings
        self._targets = CopyTargets(copy_rps=settings.copy_rps, cooldown_s=settings.cooldown_s)
        self._retries = LoadRetries()
        self._orders = RendezvousCache()
        self._ranks = RankCache()
        self._placed: set[str] = set()
        self._changed = asyncio.Event()
        self._report: LoadReport | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        etcd: EtcdClient,
        lease: LeaseKeeper,
        *,
        load_key: str,
        namespace: str,
        controller: LoraController,
        settings: PlacementSettings,
    ) -> Placement:
        """Publish the load record, watch the fleet, and converge from now on."""
        caches = await _watch_all(etcd, namespace)
        specs, cards, loads, slo_copies = caches
        placement = cls(
            controller=controller, instance_id=lease.lease_id, specs=specs, cards=cards,
            loads=loads, slo_copies=slo_copies, settings=settings,
        )  # fmt: skip
        demand = DemandMeter(half_life_s=settings.demand_half_life_s)
        controller.attach_fleet(placement, demand=demand, in_use_s=settings.in_use_s)
        placement._report = LoadReport.start(
            lease, load_key, controller=controller, failures=lambda: placement._retries.failures
        )
        for cache in caches:
            cache.subscribe(lambda *_: placement._changed.set())
        placement._changed.set()
        placement._task = asyncio.create_task(placement._placement_loop(), name="placement")
        return placement

    async def aclose(self) -> None:
        """Stop converging and delete the load record (adapters stay until the worker stops)."""
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._report is not None:
            await self._report.aclose()
        self._controller.attach_fleet(None)
        for cache in (self._specs, self._cards, self._loads, self._slo_copies):
            await cache.aclose()

    def peers(self) -> dict[int, int]:
        """Live instances (this one included) serving the same base model with adapters,
        with their adapter slots."""
        return {iid: limits.max_loras for iid, limits in self._peer_limits().items()}

    def _peer_limits(self) -> dict[int, RuntimeConfig]:
        """The limits (slots, largest rank) of the live instances serving the same base
        model with adapters, this one included, from their base cards."""
        controller = self._controller
        limits = {self._instance_id: RuntimeConfig(max_loras=controller.max_loras,
                  max_lora_rank=controller.max_lora_rank, enable_lora=True)}  # fmt: skip
        for key, card in self._cards.items.items():
            same_base = card.lora is None and card.display_name == self._base_model
            if same_base and card.runtime_config.enable_lora:
                limits[parse_card_key(key)[1]] = card.runtime_config
        return limits

    def takers(self, specs: Mapping[str, AdapterSpec]) -> dict[str, list[int]]:
        """Adapter -> the live instances of this base model that can take it: its rank (from
        its files where visible, else learned from refusals of its source) within their
        limit (``fleet.adapter_fit``)."""
        ranks = {iid: limits.max_lora_rank for iid, limits in self._peer_limits().items()}
        refused = self._rank_refusals()
        takers = {}
        for name, spec in specs.items():
            uri = redact_uri(spec.source.uri)
            limits = [ranks[iid] for iid, at in refused.get(name, ()) if at == uri and iid in ranks]
            takers[name] = can_take(least_rank(self._ranks.rank(spec.source.uri), limits), ranks)
        return takers

    def _rank_refusals(self) -> dict[str, list[tuple[int, str]]]:
        """Adapter -> (instance, source) of each refusal for its rank: this worker's and its
        peers' (their load records)."""
        failed = [(self._instance_id, self._retries.failures)]
        failed += [(parse_load_key(key)[1], load.failed) for key, load in self._loads.items.items()]
        refused: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for iid, failures in failed:
            for name, failure in failures.items():
                if failure.code == AdapterRankError.code:
                    refused[name].append((iid, failure.uri))
        return refused

    def demand_rps(self, name: str) -> float:
        """Requests per second for ``name`` across the fleet: the peers' load records, and
        this worker's own counter (fresher than its record)."""
        others = sum(load.demand.get(name, 0.0) for load in self._peer_loads())
        return others + self._controller.demand.rate(name)

    def copies(self, name: str) -> int:
        """Live instances whose cards show ``name`` now."""
        return sum(1 for card in self._cards.items.values() if card.lora and card.lora.name == name)

    def _peer_loads(self) -> list[InstanceLoad]:
        """The other instances' load records for this base model."""
        return [
            load
            for key, load in self._loads.items.items()
            if load.base_model == self._base_model and parse_load_key(key)[1] != self._instance_id
        ]

    async def _placement_loop(self) -> None:
        last_pass = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self._recheck_in_s())
            self._changed.clear()
            await asyncio.sleep(max(DEBOUNCE_S, last_pass + MIN_PASS_INTERVAL_S - time.monotonic()))
            last_pass = time.monotonic()
            try:
                await self.reconcile()
            except Exception:
                log.exception("placement pass failed; retrying")

    def _recheck_in_s(self) -> float:
        """Until the next retry, cool-down end or periodic pass, whichever comes first."""
        waits = [RECHECK_S, self._retries.next_retry_in_s(), self._targets.next_drop_in_s()]
        return min(wait for wait in waits if wait is not None)

    def plan(self) -> dict[str, list[int]]:
        """The fleet-wide plan for this base model: adapter -> instances that should hold it."""
        specs = self._my_specs()
        peers = self.peers()
        self._targets.retain(specs)
        self._orders.retain(specs)
        self._ranks.retain({spec.source.uri for spec in specs.values()})
        takers = self.takers(specs)
        if self._settings.policy is PlacementPolicy.RENDEZVOUS:
            return {
                name: chosen_instances(name, replica_bounds(spec)[0], takers[name])
                for name, spec in specs.items()
            }  # fmt: skip
        slo = {record.name: record for record in self._slo_copies.items.values()}
        copies = {
            name: self._target(spec, len(takers[name]), self.demand_rps(name), slo.get(name))
            for name, spec in specs.items()
        }
        held = self._held(peers)
        held[self._instance_id] |= set(self._controller.loaded)  # before its card shows
        demand = self._published_demand(specs)
        allowed = {name: where for name, where in takers.items() if len(where) < len(peers)}
        return plan_copies(copies, peers, held=held, demand=demand, cache=self._orders,
                           allowed=allowed)  # fmt: skip

    def _published_demand(self, names: Iterable[str]) -> dict[str, float]:
        """Fleet demand per adapter from the load records alone, this worker's included:
        every worker weighs copies from the same figures, so their plans agree. One pass
        over the records' entries, not one per adapter."""
        summed: dict[str, float] = defaultdict(float)
        for load in self._loads.items.values():
            if load.base_model == self._base_model:
                for name, rps in load.demand.items():
                    summed[name] += rps
        return {name: summed.get(name, 0.0) for name in names}

    def _target(
        self, spec: AdapterSpec, instances: int, demand_rps: float, slo: SloCopies | None
    ) -> int:
        """Copies from demand between the bounds; at least the copies its latency targets
        added (``slo``) while it has demand (``fleet.slo.slo_floor``)."""
        low, high = (instances if n == "all" else n for n in replica_bounds(spec))
        floor = slo_floor(slo, demand_rps=demand_rps, in_use_rps=IN_USE_RPS)
        low = max(low, min(high, floor))
        return self._targets.target(spec.name, low=low, high=high, demand_rps=demand_rps)

    def _held(self, peers: dict[int, int]) -> dict[int, set[str]]:
        """Instance -> adapters it has a card for or is loading now."""
        held: dict[int, set[str]] = defaultdict(set)
        for key, card in self._cards.items.items():
            if card.lora is not None and card.lora.base_model == self._base_model:
                held[parse_card_key(key)[1]].add(card.lora.name)
        for key, load in self._loads.items.items():
            if (iid := parse_load_key(key)[1]) in peers:
                held[iid].update(load.loading)
        return held

    def _my_specs(self) -> dict[str, AdapterSpec]:
        specs = self._specs.items.values()
        return {spec.name: spec for spec in specs if spec.base_model == self._base_model}

    async def reconcile(self) -> None:
        """One pass: load what this instance is chosen for, unload what it no longer is."""
        specs = self._my_specs()
        plan = self.plan()
        mine = {name for name, where in plan.items() if self._instance_id in where}
        controller = self._controller
        controller.assign(
            {n: Assignment(placed=n in mine, pinned=s.pinned) for n, s in specs.items()}
        )
        loaded = set(controller.loaded)
        refused = {name for name, failure in self._retries.failures.items()
                   if failure.code == AdapterRankError.code and name in specs}  # fmt: skip
        self._retries.retain(mine | (loaded & specs.keys()) | refused)  # a refusal stays known
        self._placed |= mine & loaded
        for name in sorted(mine | (loaded & specs.keys())):  # a changed source: swap versions
            swap = name in loaded and self._source_changed(specs[name])
            if (name not in loaded or swap) and self._retries.due(name, specs[name].source):
                await self._load(specs[name], replace=swap)
        for name in sorted(set(controller.loaded) - mine):
            if name in specs and name in self._placed and self._keeps_copy(name, plan):
                self._placed.discard(name)  # the plan let go of it: on demand's from now on
            if self._should_unload(name, name in specs, plan):
                await self._unload(name)

    def _source_changed(self, spec: AdapterSpec) -> bool:
        """Whether the loaded copy of ``spec`` came from another source, or has another digest
        than the one the desired state expects."""
        record = self._controller.records[spec.name]
        expected = expected_digest(spec.source)
        return record.source != spec.source.uri or expected not in (None, record.digest)

    def _keeps_copy(self, name: str, plan: dict[str, list[int]]) -> bool:
        """Whether this instance keeps its copy of a desired adapter the plan places nowhere
        now (demand fell to one copy of a ``min_replicas: 0`` adapter): the holder first in
        rendezvous order does, as an on-demand copy, so the adapter stays warm; every
        worker picks the same one."""
        if plan.get(name):
            return False
        held = self._held(self.peers())
        holders = {iid for iid, names in held.items() if name in names}
        first = next((iid for iid in self._orders.order(name) if iid in holders), None)
        return first == self._instance_id

    def _should_unload(self, name: str, desired: bool, plan: dict[str, list[int]]) -> bool:
        idle_s = self._controller.idle_s(name)
        if self._controller.records[name].role is Role.DELETED:
            return idle_s > 0  # deleted from the desired state: once idle
        if name in self._placed:  # no longer chosen: once idle, and once the copies the
            # plan wants are live (make before break: a moving copy is never missing)
            return idle_s > 0 and (not desired or self.copies(name) > len(plan.get(name, ())))
        return desired and idle_s > self._settings.idle_unload_s  # on demand: while used

    async def _load(self, spec: AdapterSpec, *, replace: bool = False) -> None:
        try:
            # evict_placed=False: the only other copies it could evict are ones the plan
            # also wants here, which then evicted each other in turn (bench.placement)
            load = LoadLoraRequest(lora_name=spec.name, source=spec.source, evict_placed=False,
                                   replace=replace)  # fmt: skip
            await self._controller.load(load)
        except (CapacityError, UnavailableError) as exc:
            # Not the adapter's failure: this worker is full (every slot pinned, busy,
            # placed or the last warm copy in use) or stopping. No record, no backoff: the
            # next pass tries again, and the frontend keeps serving the adapter from elsewhere.
            log.debug("placement load deferred", adapter=spec.name, code=exc.code)
            return
        except LorafleetError as exc:
            self._retries.failed(spec.name, spec.source.uri, exc, spec.source)
            if self._report is not None:
                self._report.mark_changed()
            return
        self._retries.succeeded(spec.name)  # the controller's change marks the record
        if not replace:  # a swap keeps the copy's role
            self._placed.add(spec.name)
        log.info("placement loaded adapter", adapter=spec.name)

    async def _unload(self, name: str) -> None:
        try:
            await self._controller.unload(UnloadLoraRequest(lora_name=name))
        except LorafleetError as exc:
            log.warning("placement could not unload adapter", adapter=name, error=exc.message)
            return
        self._placed.discard(name)
        log.info("placement unloaded adapter", adapter=name)
