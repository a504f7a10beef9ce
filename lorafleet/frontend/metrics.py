"""Prometheus metrics of one frontend: requests, errors, latencies, migrations, on-demand loads,
each alias version's requests, errors and TTFT, each tenant's requests, tokens,
refusals and TTFT, and each adapter's attainment of its latency targets.

Each frontend app owns its own ``CollectorRegistry``, so several apps can live
in one process (tests). Labels are the served model name (``""`` for a name
nobody serves, to bound cardinality) and the endpoint (``chat``, ``completions``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from lorafleet.frontend.kv.routing_metrics import RoutingMetrics
from lorafleet.process.build_info import lorafleet_version, python_version

__all__ = [
    "FrontendMetrics",
    "METRICS_CONTENT_TYPE",
]

_M = TypeVar("_M", Counter, Gauge, Histogram)

METRICS_CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
LATENCY_BUCKETS_S: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip


class FrontendMetrics:
    """The frontend's counters and histograms, with label children cached per model."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = ("model", "endpoint")
        self.requests = Counter(
            "lorafleet_frontend_requests", "HTTP requests answered, by status",
            [*labels, "status"], registry=self.registry,
        )  # fmt: skip
        self.errors = Counter(
            "lorafleet_frontend_errors", "Requests that failed, by error code",
            [*labels, "code"], registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "lorafleet_frontend_request_duration_seconds", "Request time to the last byte",
            labels, buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.first_token = Histogram(
            "lorafleet_frontend_time_to_first_token_seconds", "Request time to the first token",
            labels, buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.inflight = Gauge(
            "lorafleet_frontend_inflight_requests", "Generate requests in progress",
            labels, registry=self.registry,
        )  # fmt: skip
        self.migrations = Counter(
            "lorafleet_frontend_stream_migrations",
            "Streams continued on another instance after theirs was lost",
            ["model"], registry=self.registry,
        )  # fmt: skip
        self.on_demand_loads = Counter(
            "lorafleet_frontend_on_demand_loads", "On-demand adapter loads, by outcome",
            ["outcome"], registry=self.registry,
        )  # fmt: skip
        self.on_demand_seconds = Histogram(
            "lorafleet_frontend_on_demand_load_duration_seconds",
            "Time from a cold request to its adapter's card in this frontend's registry",
            buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.alias_requests = Counter(
            "lorafleet_frontend_alias_requests", "Requests to an alias, by version and outcome",
            ["alias", "version", "outcome"], registry=self.registry,
        )  # fmt: skip
        self.alias_first_token = Histogram(
            "lorafleet_frontend_alias_time_to_first_token_seconds",
            "Time to the first token of requests to an alias, by version",
            ["alias", "version"], buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.tenant_requests = Counter(
            "lorafleet_frontend_tenant_requests", "Admitted requests of a tenant, by status",
            ["tenant", "status"], registry=self.registry,
        )  # fmt: skip
        self.tenant_tokens = Counter(
            "lorafleet_frontend_tenant_tokens", "Prompt plus completion tokens of a tenant",
            ["tenant"], registry=self.registry,
        )  # fmt: skip
        self.tenant_refusals = Counter(
            "lorafleet_frontend_tenant_refusals",
            "Requests of a tenant refused, by the limit hit (429) or 'model' (404)",
            ["tenant", "limit"], registry=self.registry,
        )  # fmt: skip
        self.tenant_first_token = Histogram(
            "lorafleet_frontend_tenant_time_to_first_token_seconds",
            "Time to the first token of a tenant's requests",
            ["tenant"], buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.slo_attainment_share = Gauge(
            "lorafleet_frontend_adapter_slo_attainment",
            "Share of an adapter's answered requests within its latency targets in the last "
            "judged window with requests, across every frontend",
            ["adapter"], registry=self.registry,
        )  # fmt: skip
        self.build_info = Gauge(
            "lorafleet_build_info", "Always 1; the labels say which lorafleet runs",
            ["version", "python_version", "component"], registry=self.registry,
        )  # fmt: skip
        self.build_info.labels(lorafleet_version(), python_version(), "frontend").set(1)
        self.etcd_in_sync = Gauge(
            "lorafleet_frontend_etcd_in_sync",
            "1 while this frontend's view of etcd is current; 0 while etcd is cut off and "
            "it routes by its last view",
            registry=self.registry,
        )  # fmt: skip
        self.unreachable = Gauge(
            "lorafleet_frontend_unreachable_instances",
            "Instances this frontend lost over NATS and keeps out of routing until they "
            "answer a ping (a cut or stalled NATS route while etcd still lists them)",
            registry=self.registry,
        )  # fmt: skip
        self.routing = RoutingMetrics(self.registry)
        """The prefix router's and its events listener's series (``frontend.kv``)."""
        self._children: dict[tuple[object, ...], Any] = {}

    def follow_etcd(self, in_sync: Callable[[], bool]) -> None:
        """Read ``lorafleet_frontend_etcd_in_sync`` from ``in_sync`` at every scrape."""
        self.etcd_in_sync.set_function(lambda: float(in_sync()))

    def follow_unreachable(self, count: Callable[[], int]) -> None:
        """Read ``lorafleet_frontend_unreachable_instances`` from ``count`` at every scrape."""
        self.unreachable.set_function(lambda: float(count()))

    def started(self, model: str, endpoint: str) -> None:
        """A generate request for a served model began."""
        self._child(self.inflight, model, endpoint).inc()

    def ended(self, model: str, endpoint: str) -> None:
        """A generate request that ``started`` ended, however it ended."""
        self._child(self.inflight, model, endpoint).dec()

    def answered(self, model: str, endpoint: str, status: int, duration_s: float) -> None:
        """Count one answered request and its latency."""
        self._child(self.requests, model, endpoint, str(status)).inc()
        self._child(self.latency, model, endpoint).observe(duration_s)

    def failed(self, model: str, endpoint: str, code: str) -> None:
        """Count one error by its stable code."""
        self._child(self.errors, model, endpoint, code).inc()

    def rejected(self, endpoint: str, status: int, code: str) -> None:
        """Count a request refused before it named a served model (e.g. an invalid body)."""
        self._child(self.requests, "", endpoint, str(status)).inc()
        self._child(self.errors, "", endpoint, code).inc()

    def first_token_after(self, model: str, endpoint: str, seconds: float) -> None:
        """Record the time to the first token."""
        self._child(self.first_token, model, endpoint).observe(seconds)

    def migrated(self, model: str) -> None:
        """Count one stream continued on another instance."""
        self._child(self.migrations, model).inc()

    def on_demand_load(self, outcome: str, seconds: float) -> None:
        """Count one on-demand load (``ok`` or an error code) and how long it took."""
        self.on_demand_loads.labels(outcome).inc()
        self.on_demand_seconds.observe(seconds)

    def alias_request(
        self, alias: str, version: str, *, failed: bool, ttft_s: float | None
    ) -> None:
        """Count one ended request to ``alias`` that ``version`` answered (or failed)."""
        self._child(self.alias_requests, alias, version, "error" if failed else "ok").inc()
        if ttft_s is not None:
            self._child(self.alias_first_token, alias, version).observe(ttft_s)

    def tenant_answered(self, tenant: str, status: int, tokens: int, ttft_s: float | None) -> None:
        """Count one ended request of ``tenant``: its status, tokens and TTFT."""
        self._child(self.tenant_requests, tenant, str(status)).inc()
        if tokens:
            self._child(self.tenant_tokens, tenant).inc(tokens)
        if ttft_s is not None:
            self._child(self.tenant_first_token, tenant).observe(ttft_s)

    def tenant_refused(self, tenant: str, limit: str) -> None:
        """Count one request of ``tenant`` refused by ``limit`` (or ``model``)."""
        self._child(self.tenant_refusals, tenant, limit).inc()

    def slo_attainment(self, adapter: str, share: float) -> None:
        """Set ``adapter``'s attainment of its latency targets (the fleet's last window)."""
        self._child(self.slo_attainment_share, adapter).set(share)

    def slo_forget(self, adapter: str) -> None:
        """Drop ``adapter``'s attainment series: its targets were removed, or it was deleted."""
        if self._children.pop((id(self.slo_attainment_share), adapter), None) is not None:
            self.slo_attainment_share.remove(adapter)

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)

    def _child(self, metric: _M, *labels: str) -> _M:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child
