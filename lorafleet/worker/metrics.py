"""Prometheus metrics of a worker process, served on ``/metrics``.

Names follow vLLM's (``vllm:*``, labels ``model_name`` and ``lora_name``) where vLLM has
the series, so dashboards built for vLLM work unchanged; lorafleet's own series
(``lorafleet_worker_*``) cover what vLLM has no name for: adapter loads and the adapter
cache. ``docs/metrics.md`` lists every series and where its name comes from.
"""

from __future__ import annotations

import time
from typing import Final

from prometheus_client import Counter, Gauge, Histogram

from lorafleet.process.build_info import lorafleet_version, python_version

__all__ = [
    "ADAPTER_CACHE_BYTES",
    "ADAPTER_CACHE_LOOKUPS",
    "ADAPTER_LOAD_SECONDS",
    "ADAPTER_OPERATIONS",
    "BUILD_INFO",
    "E2E_SECONDS",
    "GENERATED_TOKENS",
    "GENERATION_TOKENS",
    "INFLIGHT_REQUESTS",
    "KV_CACHE_BLOCKS",
    "KV_EVENTS_DROPPED",
    "LOADED_ADAPTERS",
    "LORA_REQUESTS_INFO",
    "LORA_SLOTS",
    "PREFIX_CACHE_HITS",
    "PREFIX_CACHE_QUERIES",
    "PROMPT_TOKENS",
    "QUEUE_SECONDS",
    "REQUESTS",
    "REQUEST_SECONDS",
    "REQUEST_SUCCESS",
    "TIME_PER_OUTPUT_TOKEN_SECONDS",
    "TTFT_SECONDS",
    "observe_kv_blocks",
    "observe_lora_state",
    "observe_prefix_cache",
    "prefix_cache_totals",
]

REQUEST_LABELS: Final = ("model_name", "lora_name")
"""vLLM's ``model_name`` (the base model's served name) and the adapter's name ("" for none)."""

LATENCY_BUCKETS_S: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0,
)  # fmt: skip

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

PROMPT_TOKENS = Counter("vllm:prompt_tokens", "Prefill tokens processed", REQUEST_LABELS)
GENERATION_TOKENS = Counter("vllm:generation_tokens", "Generation tokens produced", REQUEST_LABELS)
REQUEST_SUCCESS = Counter(
    "vllm:request_success", "Requests that finished, by finish reason",
    [*REQUEST_LABELS, "finished_reason"],
)  # fmt: skip
TTFT_SECONDS = Histogram(
    "vllm:time_to_first_token_seconds", "Time from request arrival to its first token",
    REQUEST_LABELS, buckets=LATENCY_BUCKETS_S,
)  # fmt: skip
TIME_PER_OUTPUT_TOKEN_SECONDS = Histogram(
    "vllm:time_per_output_token_seconds", "Mean time between output tokens, per request",
    REQUEST_LABELS, buckets=LATENCY_BUCKETS_S,
)  # fmt: skip
E2E_SECONDS = Histogram(
    "vllm:e2e_request_latency_seconds", "Time from request arrival to its last token",
    REQUEST_LABELS, buckets=LATENCY_BUCKETS_S,
)  # fmt: skip
QUEUE_SECONDS = Histogram(
    "vllm:request_queue_time_seconds", "Time a request waited before the engine ran it",
    REQUEST_LABELS, buckets=LATENCY_BUCKETS_S,
)  # fmt: skip
PREFIX_CACHE_QUERIES = Counter(
    "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", REQUEST_LABELS
)
PREFIX_CACHE_HITS = Counter(
    "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", REQUEST_LABELS
)
KV_CACHE_BLOCKS = Gauge(
    "lorafleet_kv_cache_blocks", "KV cache blocks held, per model version (as the events say)",
    [*REQUEST_LABELS, "version"],
)  # fmt: skip
KV_EVENTS_DROPPED = Counter(
    "lorafleet_worker_kv_events_dropped", "KV block events not published, by reason",
    ["reason"],
)  # fmt: skip
LORA_REQUESTS_INFO = Gauge(
    "vllm:lora_requests_info",
    "Adapter slots and the adapters loaded now; the value is when this was last set",
    ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
)
LOADED_ADAPTERS = Gauge(
    "lorafleet_worker_loaded_adapters", "Adapters loaded on this worker", ["model_name"]
)
LORA_SLOTS = Gauge(
    "lorafleet_worker_lora_slots", "Adapter slots of this worker (max_loras)", ["model_name"]
)
ADAPTER_LOAD_SECONDS = Histogram(
    "lorafleet_worker_adapter_load_seconds",
    "Time to make an adapter servable: fetch (or cache hit) and engine load",
    buckets=LATENCY_BUCKETS_S,
)
ADAPTER_CACHE_LOOKUPS = Counter(
    "lorafleet_worker_adapter_cache_lookups", "Adapter cache lookups by result (hit, miss)",
    ["result"],
)  # fmt: skip
ADAPTER_CACHE_BYTES = Counter(
    "lorafleet_worker_adapter_cache_fetched_bytes", "Bytes of adapter files fetched into the cache"
)
BUILD_INFO = Gauge(
    "lorafleet_build_info", "Always 1; the labels say which lorafleet runs",
    ["version", "python_version", "component"],
)  # fmt: skip


BUILD_INFO.labels(lorafleet_version(), python_version(), "worker").set(1)
for _result in ("hit", "miss"):
    ADAPTER_CACHE_LOOKUPS.labels(_result)  # both series exist, at 0, before the first lookup


def observe_lora_state(model_name: str, max_loras: int, running: list[str]) -> None:
    """Set the adapter gauges after adapters changed: vLLM's info series and ours."""
    LORA_REQUESTS_INFO.clear()
    LORA_REQUESTS_INFO.labels(str(max_loras), "", ",".join(sorted(running))).set(time.time())
    LOADED_ADAPTERS.labels(model_name).set(len(running))
    LORA_SLOTS.labels(model_name).set(max_loras)


def observe_prefix_cache(model_name: str, lora_name: str, queries: int, hits: int) -> None:
    """Count one prompt's tokens looked up in the prefix cache and those found (vLLM's)."""
    PREFIX_CACHE_QUERIES.labels(model_name, lora_name).inc(queries)
    PREFIX_CACHE_HITS.labels(model_name, lora_name).inc(hits)


def prefix_cache_totals() -> tuple[int, int]:
    """Prompt tokens looked up and found in the prefix cache since start, all models
    together (the load record's ``prefix_cache_queries`` and ``prefix_cache_hits``)."""
    return _total(PREFIX_CACHE_QUERIES), _total(PREFIX_CACHE_HITS)


def _total(counter: Counter) -> int:
    return int(
        sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))
    )


def observe_kv_blocks(model_name: str, blocks: dict[str, int]) -> None:
    """Set the blocks-held gauge to ``blocks`` (by version: ``name@digest``, or the base
    model's name)."""
    KV_CACHE_BLOCKS.clear()
    for version, count in blocks.items():
        lora_name = "" if version == model_name else version.partition("@")[0]
        KV_CACHE_BLOCKS.labels(model_name, lora_name, version).set(count)
