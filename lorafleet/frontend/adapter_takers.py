"""Which live instances can take a desired adapter, as the workers' placement judges it.

An instance of the adapter's base model that loads adapters (its base card) can take it
when its ``max_lora_rank`` admits the adapter's rank (``fleet.adapter_fit``): the rank
read from a ``file://`` source this frontend can see, or learned from refusals of that
source (the workers' load records, and this frontend's own on-demand loads). On-demand
loads go only to these instances; when there are instances but none can take it, the
adapter is ``unplaceable`` and nobody tries. Must not load anything: ``on_demand.py`` does.
"""

from __future__ import annotations

from lorafleet.fleet.adapter_fit import RankCache, can_take, least_rank, unplaceable_reason
from lorafleet.frontend.fleet_loads import FleetLoads
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.proto.adapters import AdapterSpec
from lorafleet.proto.errors import AdapterRankError
from lorafleet.proto.uris import redact_uri

__all__ = ["AdapterTakers"]


class AdapterTakers:
    """The instances that can take each adapter, from the registry's cards and load records."""

    def __init__(self, registry: ModelRegistry, loads: FleetLoads) -> None:
        self._registry = registry
        self._loads = loads
        self._ranks = RankCache()
        self._refused: dict[tuple[str, str], set[int]] = {}
        """(adapter, redacted source) -> instances that refused this frontend's load of it
        for its rank."""

    def limits(self, base_model: str) -> dict[int, int]:
        """Instance id -> ``max_lora_rank`` of the live instances of ``base_model`` that load
        adapters (their base cards say ``enable_lora``)."""
        base = self._registry.get(base_model)
        if base is None or base.parent is not None:
            return {}
        limits = {}
        for instance in base.instances:
            card = self._registry.card_on(base_model, instance.instance_id)
            if card is not None and card.enable_lora:
                limits[instance.instance_id] = card.max_lora_rank
        return limits

    def takers(self, spec: AdapterSpec) -> list[int]:
        """The live instances that can take ``spec`` (those of ``limits``)."""
        limits = self.limits(spec.base_model)
        return can_take(self._least_rank(spec, limits), limits)

    def unplaceable(self, spec: AdapterSpec) -> str:
        """Why no live instance can take ``spec``; "" when one can, or when no instance of its
        base model is live (then it waits for one: ``pending``)."""
        limits = self.limits(spec.base_model)
        rank = self._least_rank(spec, limits)
        if not limits or can_take(rank, limits):
            return ""
        return unplaceable_reason(spec.name, rank, limits)

    def refused(self, spec: AdapterSpec, instance_id: int) -> None:
        """Instance ``instance_id`` refused ``spec`` for its rank: neither it nor any instance
        with a limit as low is asked again for this source."""
        self._refused.setdefault((spec.name, redact_uri(spec.source.uri)), set()).add(instance_id)

    def _least_rank(self, spec: AdapterSpec, limits: dict[int, int]) -> int:
        uri = redact_uri(spec.source.uri)
        refusers = set(self._refused.get((spec.name, uri), ()))
        for instance_id, failure in self._loads.failures(spec.name).items():
            if failure.code == AdapterRankError.code and failure.uri == uri:
                refusers.add(instance_id)
        refused = [limits[iid] for iid in refusers if iid in limits]
        return least_rank(self._ranks.rank(spec.source.uri), refused)
