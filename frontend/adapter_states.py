"""Where each desired adapter stands: placed, loading, failed, pending or cold, and why.

Read from what this frontend already follows (cards, load records, its own
on-demand loads and failures); never from etcd in the request. ``/v1/adapters``,
``/v1/models`` and ``lorafleet lora`` show the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from lorafleet.frontend.fleet_loads import FleetLoads
from lorafleet.frontend.load_failures import LoadFailures
from lorafleet.frontend.on_demand import OnDemandLoader
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.proto.adapters import (
    AdapterLoadError,
    AdapterSpec,
    AdapterState,
    AdapterStatus,
    LoraSource,
    replica_bounds,
)
from lorafleet.proto.uris import public_uri

__all__ = ["AdapterStates", "StateOf"]

DEMAND_DIGITS: Final = 3
"""Requests per second are shown to a thousandth."""


@dataclass(frozen=True, slots=True)
class StateOf:
    """One adapter's state, the instances holding and loading it, and its failure if failed."""

    state: AdapterState
    instances: list[str]
    loading: list[str]
    error: AdapterLoadError | None = None


class AdapterStates:
    """Computes ``AdapterStatus`` for desired adapters from the frontend's caches."""

    def __init__(
        self, registry: ModelRegistry, loads: FleetLoads, failures: LoadFailures,
        loader: OnDemandLoader,
    ) -> None:  # fmt: skip
        self._registry = registry
        self._loads = loads
        self._failures = failures
        self._loader = loader

    def state_of(self, spec: AdapterSpec) -> StateOf:
        """``placed`` (a live card), ``loading`` (an instance or this frontend loads it),
        ``failed`` (its last load failed), else ``pending`` or ``cold`` (``min_replicas`` 0)."""
        served = self._registry.get(spec.name)
        holders = served.instances if served is not None and served.parent is not None else ()
        instances = [f"{instance.instance_id:x}" for instance in holders]
        loading = [f"{instance_id:x}" for instance_id in self._loads.loading(spec.name)]
        if instances:
            return StateOf("placed", instances, loading)
        if loading or self._loader.is_loading(spec.name):
            return StateOf("loading", instances, loading)
        failure = self._failures.last(spec.name)
        if failure is not None:
            return StateOf("failed", instances, loading, failure.describe())
        low, _high = replica_bounds(spec)
        return StateOf("cold" if low == 0 else "pending", instances, loading)

    def status(self, spec: AdapterSpec, warnings: list[str] | None = None) -> AdapterStatus:
        """``spec`` with its URI as anyone may see it (``public_uri``), its bounds in force,
        its state and its recent demand."""
        low, high = replica_bounds(spec)
        now = self.state_of(spec)
        return AdapterStatus(
            name=spec.name, base_model=spec.base_model,
            source=LoraSource(uri=public_uri(spec.source.uri)),
            replicas=spec.replicas, min_replicas=low, max_replicas=high, pinned=spec.pinned,
            instances=now.instances, warnings=warnings or [], state=now.state,
            loading=now.loading, demand=round(self._loads.demand(spec.name), DEMAND_DIGITS),
            error=now.error,
        )  # fmt: skip
