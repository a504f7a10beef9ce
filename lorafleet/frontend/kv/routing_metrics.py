"""Prometheus series of prefix-aware routing: decisions by reason, overlap, index size, events.

Registered on the frontend's own ``CollectorRegistry`` (``FrontendMetrics.routing``), so they
appear on its ``/metrics``; ``docs/metrics.md`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["DecisionReason", "DropReason", "RoutingMetrics"]

DecisionReason = Literal["overlap", "load", "approximate", "no_index"]
"""Why the prefix router chose an instance: it holds the longest cached prefix (``overlap``,
from events; ``approximate``, from where this frontend sent the prefix), another held more
but was busier by more than it saved (``load``), or no instance held any of it
(``no_index``: also a prompt too short to route by, a single candidate, or an index error)."""
DropReason = Literal["unknown_instance", "unknown_version", "malformed", "index_full"]
LAG_BUCKETS_S: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class RoutingMetrics:
    """The prefix router's and the events listener's series."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "lorafleet_router_decisions", "Prefix-router choices, by reason",
            ["reason"], registry=registry,
        )  # fmt: skip
        self.overlap_tokens = Counter(
            "lorafleet_router_overlap_tokens",
            "Prompt tokens the chosen instance held cached (as the router saw it)",
            registry=registry,
        )  # fmt: skip
        self.index_blocks = Gauge(
            "lorafleet_kv_index_blocks", "Blocks in this frontend's prefix index",
            registry=registry,
        )  # fmt: skip
        self.event_lag = Histogram(
            "lorafleet_kv_event_lag_seconds",
            "From a worker sending a KV event batch to this frontend applying it",
            buckets=LAG_BUCKETS_S, registry=registry,
        )  # fmt: skip
        self.events_dropped = Counter(
            "lorafleet_kv_events_dropped", "KV events not indexed, by reason",
            ["reason"], registry=registry,
        )  # fmt: skip
        self.followed = Gauge(
            "lorafleet_kv_followed_instances",
            "Instances whose KV events this frontend has all applied since a snapshot or "
            "their first batch (the others are routed approximately)",
            registry=registry,
        )  # fmt: skip
        self.snapshots = Counter(
            "lorafleet_kv_snapshots", "Snapshots asked of instances, by outcome",
            ["outcome"], registry=registry,
        )  # fmt: skip
        self._decisions = {reason: self.decisions.labels(reason)
                           for reason in get_args(DecisionReason)}  # fmt: skip
        """Each reason's series, made once (``labels`` locks and looks up on every call)."""

    def follow_index(self, size: Callable[[], int], followed: Callable[[], int]) -> None:
        """Read the index's size and the instances it follows at every scrape."""
        self.index_blocks.set_function(lambda: float(size()))
        self.followed.set_function(lambda: float(followed()))

    def decided(self, reason: DecisionReason, overlap_tokens: int = 0) -> None:
        """Count one routing decision and the cached tokens it chose."""
        self._decisions[reason].inc()
        if overlap_tokens:
            self.overlap_tokens.inc(overlap_tokens)

    def dropped(self, reason: DropReason, count: int = 1) -> None:
        """Count ``count`` events not indexed."""
        self.events_dropped.labels(reason).inc(count)
