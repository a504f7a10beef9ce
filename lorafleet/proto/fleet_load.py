"""What each worker publishes about its adapter slots, its load and its failed loads.

One record per worker instance, at ``v1/load/{ns}/{component}/{endpoint}/{id:x}``
under the worker's lease (it vanishes with the worker). Every worker's placement
and every frontend read the same records, so they agree without a coordinator:
placement skips instances that are full or too busy, frontends send on-demand
loads to the least-loaded instance with a free slot, and ``/v1/adapters`` shows
demand, copies in flight and failures.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "EvictedAdapter",
    "InstanceLoad",
    "LoadFailure",
    "decode_instance_load",
    "encode_instance_load",
]


class LoadFailure(msgspec.Struct, kw_only=True, frozen=True):
    """The last failed attempt to load one adapter on one instance."""

    code: str
    """The error's stable code (``proto.errors``), e.g. ``source_not_found``."""
    message: str
    """The error's message, URIs redacted (records are readable by every process)."""
    at: float
    """When it failed, seconds since the epoch."""
    attempts: int = 1
    """Failed attempts in a row; the retry delay grows with it (``process.backoff``)."""
    retry_at: float = 0.0
    """When placement tries again, seconds since the epoch (0: not retried)."""
    uri: str = ""
    """The source that failed, redacted: a refusal for its rank (``adapter_rank_too_large``)
    holds for this source only (``fleet.adapter_fit``)."""


class EvictedAdapter(msgspec.Struct, kw_only=True, frozen=True):
    """An unmanaged adapter (loaded straight onto this worker, not in the desired state) that
    placement evicted here: what ``/v1/adapters`` shows, and what loads it back on demand."""

    base_model: str
    uri: str
    """Its source URI as it was loaded (desired-state records hold URIs alike)."""
    digest: str = ""
    """The content digest of the weights that were evicted (``sha256:<hex>``)."""
    at: float
    """When it was evicted, seconds since the epoch."""
    reason: str = ""
    """Why, e.g. which desired adapter took its slot."""


class InstanceLoad(msgspec.Struct, kw_only=True, frozen=True):
    """One worker's adapter slots and load, refreshed when they change (at most a few per s)."""

    base_model: str
    max_loras: int
    loaded: list[str] = msgspec.field(default_factory=list)
    """Adapters loaded here now (their cards are published)."""
    loading: list[str] = msgspec.field(default_factory=list)
    """Adapters being loaded here now (they hold a slot but have no card yet)."""
    in_flight: int = 0
    """Requests this worker is generating now."""
    demand: dict[str, float] = msgspec.field(default_factory=dict)
    """Recent requests per second per adapter served here (decayed; idle adapters drop out)."""
    failed: dict[str, LoadFailure] = msgspec.field(default_factory=dict)
    """Adapters this worker failed to load, by name, until a load of them succeeds."""
    evicts: str = ""
    """The adapter a load here would evict now ("" when none may go: pinned, busy, or the
    last warm copy of one in use). Frontends send a cold load to the full instance whose
    ``evicts`` the fleet asks least for: the worker's own choice, not a guess from
    ``loaded``, which counts busy and placed adapters too."""
    evicted: dict[str, EvictedAdapter] = msgspec.field(default_factory=dict)
    """Unmanaged adapters placement evicted here, by name, until one is loaded again (the
    worker fills it: ``docs/fleet.md``, "Unmanaged adapters")."""
    evicts_placed: bool = False
    """Whether ``evicts`` is a copy placement chose this instance for: evicting it costs a
    second load when placement puts it back, so frontends try other full instances first."""
    prefix_cache_queries: int = 0
    """Prompt tokens this worker looked up in its engine's prefix cache since it started
    (vLLM's ``vllm:prefix_cache_queries``, every model together)."""
    prefix_cache_hits: int = 0
    """Of those, the tokens found cached (``vllm:prefix_cache_hits``): the hit ratio is
    hits / queries; both 0 for an engine without a prefix cache."""

    @property
    def prefix_cache_hit_ratio(self) -> float | None:
        """``prefix_cache_hits / prefix_cache_queries``; None before any lookup (or without
        a prefix cache)."""
        if self.prefix_cache_queries <= 0:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def free_slots(self) -> int:
        """Slots neither loaded nor being loaded (evictable ones are not counted as free)."""
        return max(0, self.max_loras - len(self.loaded) - len(self.loading))


_decoder = msgspec.json.Decoder(InstanceLoad)


def decode_instance_load(raw: bytes) -> InstanceLoad:
    """Decode a load record (raises msgspec errors on bad input)."""
    return _decoder.decode(raw)


def encode_instance_load(load: InstanceLoad) -> bytes:
    """Encode a load record as compact JSON (it is rewritten often)."""
    return msgspec.json.encode(load)
