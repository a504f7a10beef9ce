"""Which served model answers a name: the registry's, else a desired adapter loaded on demand.

An unmanaged adapter that placement evicted (the workers' load records keep its
source) loads back on demand as a desired one does. A name in none of these is a
404, once this frontend's watches have caught up with etcd (read your writes: a
load answered by a worker or another frontend has its card in etcd, and the
watch may not have brought it yet). A desired adapter is *cold* while no live
instance has its card; it is listed (``loaded: false``) when a live instance
serves its base model, since a request can load it then.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Final

import structlog

from lorafleet.frontend.desired_state import DesiredState
from lorafleet.frontend.errors import (
    MAX_NAMES_IN_MESSAGE,
    ModelNotFoundError,
    NoLiveInstanceError,
    WorkerError,
)
from lorafleet.frontend.fleet_loads import FleetLoads
from lorafleet.frontend.on_demand import OnDemandLoader
from lorafleet.frontend.registry import ModelRegistry, ServedModel
from lorafleet.proto.adapters import AdapterSpec, LoraSource
from lorafleet.proto.errors import LorafleetError

__all__ = ["CATCH_UP_TIMEOUT_S", "ColdAdapter", "ModelResolver"]

log = structlog.get_logger(__name__)

CATCH_UP_TIMEOUT_S: Final = 5.0
"""How long a request for an unknown name waits for the watches to reach etcd's revision."""


@dataclass(frozen=True, slots=True)
class ColdAdapter:
    """A desired adapter no live instance has loaded, and the base model that can load it."""

    spec: AdapterSpec
    base: ServedModel


class ModelResolver:
    """Resolves request model names through the registry, the desired state and the loader."""

    def __init__(
        self, registry: ModelRegistry, desired: DesiredState, loader: OnDemandLoader,
        loads: FleetLoads,
    ) -> None:  # fmt: skip
        self.registry = registry
        self.desired = desired
        self.loader = loader
        self.loads = loads
        self._cold: tuple[tuple[int, int], list[ColdAdapter]] = ((-1, -1), [])
        """``cold()``'s answer and the (registry version, desired changes) it was built at."""

    async def resolve(self, name: str) -> ServedModel:
        """The served model ``name``, loading a cold desired adapter first; 404/503 otherwise
        (after catching up with etcd)."""
        # served now, the usual case: no coroutine awaited
        served = self.registry.get(name) or await self._load_cold(name)
        if served is None:
            await self._catch_up(name)
            served = self.registry.get(name) or await self._load_cold(name)
        if served is not None:
            return served
        if self.registry.known(name):
            raise NoLiveInstanceError(name)
        raise self.not_found(name)

    async def _load_cold(self, name: str) -> ServedModel | None:
        """Desired or evicted adapter ``name`` loaded on demand; None when it is neither."""
        spec = self.desired.get(name) or self._evicted(name)
        return None if spec is None else await self.loader.load(spec)

    def _evicted(self, name: str) -> AdapterSpec | None:
        """An unmanaged adapter that placement evicted, as a spec to load it back on demand
        from the source it had: an eviction never turns into a 404."""
        last = self.loads.last_eviction(name)
        if last is None:
            return None
        gone = last[1]
        return AdapterSpec(name=name, base_model=gone.base_model,
                           source=LoraSource(uri=gone.uri), replicas=0)  # fmt: skip

    async def _catch_up(self, name: str) -> None:
        """Wait until the instances, cards and desired state seen here are etcd's now; on
        etcd trouble or past ``CATCH_UP_TIMEOUT_S``, answer from what is seen."""
        caches = (self.registry.instance_cache, self.registry.card_cache, self.desired.cache,
                  self.loads.cache)  # fmt: skip
        try:
            await asyncio.gather(*(cache.catch_up(CATCH_UP_TIMEOUT_S) for cache in caches))
        except (TimeoutError, LorafleetError) as exc:
            log.info("unknown model answered without catching up with etcd", model=name,
                     error=str(exc) or type(exc).__name__)  # fmt: skip

    def not_found(self, name: str) -> ModelNotFoundError:
        """The 404 for ``name``, naming the first names that exist and how many there are.

        It copies no more than ``MAX_NAMES_IN_MESSAGE`` names: a request for an unknown
        name costs the same with 10 or 100,000 cards.
        """
        cold = sorted(adapter.spec.name for adapter in self.cold())  # not served: disjoint
        first = self.registry.first_names(MAX_NAMES_IN_MESSAGE) + cold[:MAX_NAMES_IN_MESSAGE]
        return ModelNotFoundError(name, first, total=self.registry.count() + len(cold))

    async def gone_cold(self, served: ServedModel, exc: LorafleetError) -> AdapterSpec | None:
        """The spec to load again when ``exc`` says an adapter left its instances.

        That happens when an instance evicted it (LRU) or died after the registry
        was read: the worker answers ``not_found``, or no instance is left. A desired
        adapter loads from its spec; an unmanaged one from its eviction's source (the
        worker writes the eviction before the card goes, so catching up finds it).
        """
        if served.parent is None:
            return None
        evicted = isinstance(exc, WorkerError) and exc.error.code == "not_found"
        if not (evicted or isinstance(exc, NoLiveInstanceError)):
            return None
        spec = self.desired.get(served.name) or self._evicted(served.name)
        if spec is None:
            await self._catch_up(served.name)
            spec = self.desired.get(served.name) or self._evicted(served.name)
        return spec

    def cold(self) -> list[ColdAdapter]:
        """Desired adapters loaded nowhere whose base model a live instance serves, by name.

        Kept until the registry or the desired state changes: ``/v1/models`` and
        every unknown name ask for it, and it scans every desired adapter.
        """
        key = (self.registry.version(), self.desired.cache.changes)
        if self._cold[0] != key:
            self._cold = (key, self._find_cold())
        return list(self._cold[1])

    def _find_cold(self) -> list[ColdAdapter]:
        found = []
        for spec in self.desired.records():
            base = self.registry.get(spec.base_model)
            if self.registry.get(spec.name) is None and base is not None and base.parent is None:
                found.append(ColdAdapter(spec=spec, base=base))
        return found

    def names(self) -> list[str]:
        """Every name a request may use: served ones and cold adapters, sorted."""
        cold = self.cold()
        if not cold:
            return self.registry.names()  # sorted already
        return sorted({*self.registry.names(), *(adapter.spec.name for adapter in cold)})
