"""Prometheus samples read from a process's ``/metrics``, so a benchmark can count what it caused.

Counters are read before and after a measured window; the difference is what
the window did. Parsing is ``prometheus_client``'s own text parser.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from bench._http import http_once

__all__ = ["LabelFilter", "Scrape", "scrape"]

LabelFilter = Callable[[Mapping[str, str]], bool]
"""Whether a sample with these labels counts."""


class Scrape:
    """One reading of a process's metrics: sample name and labels to value."""

    def __init__(self, text: str) -> None:
        self.samples = [
            (sample.name, sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]

    def total(self, name: str, where: LabelFilter = lambda _labels: True) -> float:
        """The sum of every sample called ``name`` whose labels pass ``where``."""
        return sum(value for sample, labels, value in self.samples
                   if sample == name and where(labels))  # fmt: skip


async def scrape(port: int) -> Scrape:
    """Read ``GET /metrics`` of the process on ``port`` (a worker's status port or a frontend)."""
    response = await http_once(port, "GET", "/metrics")
    if response.status != 200:
        raise RuntimeError(f"GET /metrics on port {port} answered HTTP {response.status}")
    return Scrape(response.body.decode())
