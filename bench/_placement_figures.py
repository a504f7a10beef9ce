"""The figures of one ``bench.placement`` policy, from its requests and its metrics' differences.

Latencies come from the load generator's samples; loads and requests per
worker from the workers' counters read at the measured window's edges;
on-demand loads from the frontend's counter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from bench._metrics import Scrape
from bench._open_loop import Sample
from bench._placement_plan import BASE_TAG, MODEL
from bench._report import ms, percentile

__all__ = ["Readings", "policy_figures", "tail_from", "ttft_groups"]

TOP_ADAPTERS: Final = 10
TAIL_ADAPTERS: Final = 50
WORKER_LOADS: Final = "lorafleet_worker_adapter_operations_total"
WORKER_REQUESTS: Final = "lorafleet_worker_requests_total"
ON_DEMAND_LOADS: Final = "lorafleet_frontend_on_demand_loads_total"


@dataclass(frozen=True)
class Readings:
    """The workers' and the frontend's metrics at one edge of the window, and when (s)."""

    at_s: float
    workers: Sequence[Scrape]
    frontend: Scrape

    def loads(self) -> float:
        """Adapter loads that succeeded, over every worker."""
        return sum(w.total(WORKER_LOADS, _ok_load) for w in self.workers)

    def adapter_requests(self) -> list[float]:
        """Requests for adapters (not the base model) each worker handled."""
        return [w.total(WORKER_REQUESTS, lambda labels: labels["model"] != MODEL)
                for w in self.workers]  # fmt: skip

    def on_demand_loads(self) -> float:
        """On-demand loads the frontend made that succeeded."""
        return self.frontend.total(ON_DEMAND_LOADS, lambda labels: labels["outcome"] == "ok")


def _ok_load(labels: Mapping[str, str]) -> bool:
    return labels["operation"] == "load" and labels["outcome"] == "ok"


def tail_from(adapters: int) -> int:
    """The first rank of the tail group: the fifty least popular adapters, at most half."""
    return adapters - (min(TAIL_ADAPTERS, adapters // 2) or 1)


def ttft_groups(samples: Sequence[Sample], adapters: int) -> dict[str, list[float]]:
    """TTFTs of the top ten adapters, the fifty least popular (each at most half), the base."""
    top = min(TOP_ADAPTERS, adapters // 2) or 1
    first_tail = tail_from(adapters)
    groups: dict[str, list[float]] = {"top": [], "tail": [], "warm": []}
    for sample in samples:
        if sample.ttft_s is None:
            continue
        if sample.tag == BASE_TAG:
            groups["warm"].append(sample.ttft_s)
        if 0 <= sample.tag < top:
            groups["top"].append(sample.ttft_s)
        if sample.tag >= first_tail:
            groups["tail"].append(sample.ttft_s)
    return groups


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 2)


def policy_figures(
    samples: Sequence[Sample],
    before: Readings,
    after: Readings,
    *,
    adapters: int,
    load_s: float,
    offered_s: float,
) -> dict[str, Any]:
    """Every figure the benchmark reports for one policy (times in ms).

    Loads are counted from the first measured request until the last answer, and
    divided by the ``offered_s`` seconds the measured requests were sent over: a slow
    drain (requests waiting for loads) does not dilute the rate.
    """
    groups = ttft_groups(samples, adapters)
    warm_p99 = percentile(groups["warm"], 0.99)
    adapter_ttfts = [s.ttft_s for s in samples if s.tag != BASE_TAG and s.ttft_s is not None]
    waited = sum(ttft > (warm_p99 or 0) + load_s / 4 for ttft in adapter_ttfts)
    pairs = zip(after.adapter_requests(), before.adapter_requests(), strict=True)
    served = [now - then for now, then in pairs]
    loads = after.loads() - before.loads()
    figures: dict[str, Any] = {
        "requests": len(samples),
        "failed": sum(not s.ok for s in samples),
        "failures": dict(Counter(s.failure for s in samples if not s.ok)),
        "failure_messages": _first_messages(samples),
        "window_s": round(after.at_s - before.at_s, 1),
        "adapter_loads": int(loads),
        "loads_per_min": round(loads * 60 / offered_s, 1) if offered_s else None,
        "on_demand_loads": int(after.on_demand_loads() - before.on_demand_loads()),
        "waited_share": round(waited / len(adapter_ttfts), 4) if adapter_ttfts else None,
        "served_per_worker": [int(n) for n in served],
        "busiest_over_mean": _ratio(max(served, default=0), sum(served) / len(served)),
    }
    for group, ttfts in groups.items():
        figures[f"{group}_ttft_p50_ms"] = ms(percentile(ttfts, 0.5))
        figures[f"{group}_ttft_p99_ms"] = ms(percentile(ttfts, 0.99))
    figures["tail_over_warm_p99"] = _ratio(figures["tail_ttft_p99_ms"], ms(warm_p99))
    return figures


def _first_messages(samples: Sequence[Sample]) -> dict[str, str]:
    """The first server message of each kind of failure (why 503s happen, not just how many)."""
    messages: dict[str, str] = {}
    for sample in samples:
        if not sample.ok and sample.message:
            messages.setdefault(sample.failure, sample.message)
    return messages
