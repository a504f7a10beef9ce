"""Prometheus metrics of a worker process, served on ``/metrics``."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "ADAPTER_OPERATIONS",
    "GENERATED_TOKENS",
    "INFLIGHT_REQUESTS",
    "REQUESTS",
    "REQUEST_SECONDS",
]

REQUESTS = Counter(
    "lorafleet_worker_requests_total", "Generate requests handled", ["model", "outcome"]
)
INFLIGHT_REQUESTS = Gauge("lorafleet_worker_inflight_requests", "Generate requests in flight")
GENERATED_TOKENS = Counter(
    "lorafleet_worker_generated_tokens_total", "Completion tokens streamed", ["model"]
)
REQUEST_SECONDS = Histogram(
    "lorafleet_worker_request_seconds", "Time from request to final chunk", ["model"]
)
ADAPTER_OPERATIONS = Counter(
    "lorafleet_worker_adapter_operations_total",
    "LoRA load/unload calls by outcome",
    ["operation", "outcome"],
)
