"""Where each adapter stands: placed, loading, unplaceable, failed, pending or cold, and why; or
``unmanaged`` (loaded straight onto workers, not declared) and ``evicted`` (such an
adapter that placement evicted).

Read from what this frontend already follows (cards, load records, the desired
state, its own on-demand loads and failures); never from etcd in the request.
``/v1/adapters``, ``/v1/models`` and ``lorafleet lora`` show the same answer, so
every adapter the fleet serves is seen, declared or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

import msgspec

from lorafleet.frontend.desired_state import DesiredState
from lorafleet.frontend.fleet_loads import FleetLoads
from lorafleet.frontend.load_failures import LoadFailures, iso_time
from lorafleet.frontend.on_demand import OnDemandLoader
from lorafleet.frontend.registry import ModelRegistry, ServedModel
from lorafleet.proto.adapters import (
    AdapterEviction,
    AdapterLoadError,
    AdapterSpec,
    AdapterState,
    AdapterStatus,
    LoraSource,
    expected_digest,
    replica_bounds,
)
from lorafleet.proto.fleet_load import EvictedAdapter
from lorafleet.proto.slo import SloAttainment
from lorafleet.proto.uris import public_uri, redact_uri

__all__ = ["AdapterStates", "Attainment", "StateOf"]

DEMAND_DIGITS: Final = 3
"""Requests per second are shown to a thousandth."""
RATIO_DIGITS: Final = 3
"""Prefix-cache hit ratios are shown to a thousandth."""

Attainment: TypeAlias = Callable[[AdapterSpec], SloAttainment | None]
"""An adapter's attainment of its latency targets, None without targets
(``SloLoop.attainment``)."""


@dataclass(frozen=True, slots=True)
class StateOf:
    """One adapter's state, the instances holding and loading it, and its failure if failed."""

    state: AdapterState
    instances: list[str]
    loading: list[str]
    error: AdapterLoadError | None = None
    unplaceable: str = ""
    """Why no live instance can take it, while ``unplaceable``."""


class AdapterStates:
    """Computes ``AdapterStatus`` for every adapter from the frontend's caches."""

    def __init__(
        self, registry: ModelRegistry, desired: DesiredState, loads: FleetLoads,
        failures: LoadFailures, loader: OnDemandLoader, attainment: Attainment | None = None,
    ) -> None:  # fmt: skip
        self._registry = registry
        self._desired = desired
        self._loads = loads
        self._failures = failures
        self._loader = loader
        self._attainment = attainment

    def every(self) -> list[AdapterStatus]:
        """Every adapter, sorted by name: the desired ones and the unmanaged ones."""
        found = [self.status(spec) for spec in self._desired.records()]
        found += self.unmanaged()
        return sorted(found, key=lambda status: status.name)

    def find(self, name: str) -> AdapterStatus | None:
        """Adapter ``name``'s status, desired or unmanaged; None when the fleet has no such."""
        spec = self._desired.get(name)
        if spec is not None:
            return self.status(spec)
        served = self._registry.get(name)
        if served is not None and served.parent is not None:
            return self._served(served)
        last = self._loads.last_eviction(name)
        return None if last is None else _evicted_status(name, *last, self._demand(name))

    def unmanaged(self) -> list[AdapterStatus]:
        """Adapters that live instances serve, or placement evicted, and the desired state
        does not declare: loaded straight onto a worker (its routes, ``lorafleet lora load``)."""
        found = {
            served.name: self._served(served)
            for served in self._registry.models()
            if served.parent is not None and self._desired.get(served.name) is None
        }
        for name in self._loads.evicted():
            last = self._loads.last_eviction(name)
            if last is not None and name not in found and self._desired.get(name) is None:
                found[name] = _evicted_status(name, *last, self._demand(name))
        return list(found.values())

    def state_of(self, spec: AdapterSpec) -> StateOf:
        """``placed`` (a live card), ``loading`` (an instance or this frontend loads it),
        ``unplaceable`` (no live instance of its base model can take it: its rank),
        ``failed`` (its last load failed; also while the cards are of another source or
        digest, which keeps serving), else ``pending`` or ``cold`` (``min_replicas`` 0)."""
        served = self._registry.get(spec.name)
        holders = served.instances if served is not None and served.parent is not None else ()
        instances = [f"{instance.instance_id:x}" for instance in holders]
        loading = [f"{instance_id:x}" for instance_id in self._loads.loading(spec.name)]
        if instances:  # a failed swap to the desired source is failed, the old one serves
            failure = None if self._serves_desired(spec) else self._failures.last(spec.name)
            error = failure.describe() if failure is not None else None
            return StateOf("placed" if error is None else "failed", instances, loading, error)
        if loading or self._loader.is_loading(spec.name):
            return StateOf("loading", instances, loading)
        reason = self._loader.takers.unplaceable(spec)
        if reason:
            return StateOf("unplaceable", instances, loading, unplaceable=reason)
        failure = self._failures.last(spec.name)
        if failure is not None:
            return StateOf("failed", instances, loading, failure.describe())
        low, _high = replica_bounds(spec)
        return StateOf("cold" if low == 0 else "pending", instances, loading)

    def status(self, spec: AdapterSpec, warnings: list[str] | None = None) -> AdapterStatus:
        """``spec`` with its URI as anyone may see it (``public_uri``), its bounds in force,
        its state, its recent demand and, with targets, their attainment."""
        low, high = replica_bounds(spec)
        now = self.state_of(spec)
        return AdapterStatus(
            name=spec.name, base_model=spec.base_model,
            source=LoraSource(uri=public_uri(spec.source.uri), sha256=spec.source.sha256),
            replicas=spec.replicas, min_replicas=low, max_replicas=high, pinned=spec.pinned,
            instances=now.instances, cache_hit_ratio=self.hit_ratios(now.instances),
            warnings=[*(warnings or []), *self._card_warnings(spec.name)],
            state=now.state,
            loading=now.loading, demand=self._demand(spec.name),
            error=now.error, digest=self._digest(spec.name), slo=spec.slo,
            unplaceable=now.unplaceable,
            attainment=None if self._attainment is None else self._attainment(spec),
        )  # fmt: skip

    def _served(self, served: ServedModel) -> AdapterStatus:
        """An unmanaged adapter's status, with its demand and its instances' hit ratios."""
        status = _served_status(served, self._demand(served.name))
        return msgspec.structs.replace(status, cache_hit_ratio=self.hit_ratios(status.instances))

    def hit_ratios(self, instances: list[str]) -> dict[str, float]:
        """The prefix-cache hit ratio of each of ``instances`` (hex ids) that has one, as
        its load record says."""
        ratios: dict[str, float] = {}
        for hex_id in instances:
            load = self._loads.of(int(hex_id, 16))
            ratio = None if load is None else load.prefix_cache_hit_ratio
            if ratio is not None:
                ratios[hex_id] = round(ratio, RATIO_DIGITS)
        return ratios

    def _serves_desired(self, spec: AdapterSpec) -> bool:
        """Whether a live instance serves ``spec``'s source (and its ``sha256``, if given)."""
        served = self._registry.get(spec.name)
        uri, digest = redact_uri(spec.source.uri), expected_digest(spec.source)
        return served is not None and any(
            (card := self._registry.card_on(spec.name, i.instance_id)) is not None
            and card.source == uri and digest in (None, card.digest)
            for i in served.instances
        )  # fmt: skip

    def _card_warnings(self, name: str) -> list[str]:
        """What the worker said when it loaded the weights a live instance serves."""
        served = self._registry.get(name)
        return list(served.card.warnings) if served is not None else []

    def _demand(self, name: str) -> float:
        """Requests per second for ``name`` that the workers' load records hold, declared
        or not (each worker counts every adapter it serves)."""
        return round(self._loads.demand(name), DEMAND_DIGITS)

    def _digest(self, name: str) -> str:
        served = self._registry.get(name)
        return served.card.digest if served is not None and served.parent is not None else ""


def _served_status(served: ServedModel, demand: float) -> AdapterStatus:
    """An unmanaged adapter a live instance serves: its card says where it came from."""
    return AdapterStatus(
        name=served.name, base_model=served.parent or "", source=LoraSource(uri=served.root),
        replicas=0, min_replicas=0, max_replicas=0, state="unmanaged", demand=demand,
        instances=[f"{instance.instance_id:x}" for instance in served.instances],
        digest=served.card.digest,
        warnings=list(served.card.warnings),
    )  # fmt: skip


def _evicted_status(
    name: str, instance_id: int, last: EvictedAdapter, demand: float
) -> AdapterStatus:
    """An unmanaged adapter placement evicted everywhere: its last eviction says all."""
    return AdapterStatus(
        name=name, base_model=last.base_model, source=LoraSource(uri=public_uri(last.uri)),
        replicas=0, min_replicas=0, max_replicas=0, state="evicted", digest=last.digest,
        demand=demand,
        evicted=AdapterEviction(at=iso_time(last.at), instance=f"{instance_id:x}",
                                reason=last.reason),
    )  # fmt: skip
