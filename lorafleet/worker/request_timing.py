"""Times one generate request on a worker and records vLLM's latency and token series.

Owned by the endpoint's request task; no I/O beyond Prometheus observations.
"""

from __future__ import annotations

import time

from lorafleet.proto.inference import FinalChunk
from lorafleet.worker import metrics

__all__ = ["RequestTiming"]


class RequestTiming:
    """Arrival, first token and end of one request, observed as ``vllm:*`` series."""

    def __init__(self, base_model: str, model: str) -> None:
        adapter = "" if model == base_model else model
        self._labels = (base_model, adapter)
        self._arrived = time.perf_counter()
        self._first_token: float | None = None

    @property
    def elapsed_s(self) -> float:
        """Seconds since the request arrived."""
        return time.perf_counter() - self._arrived

    @property
    def since_first_token_s(self) -> float:
        """Seconds since the first token (0 before it)."""
        if self._first_token is None:
            return 0.0
        return time.perf_counter() - self._first_token

    def token(self) -> None:
        """A token chunk came from the engine; the first one sets the time to first token."""
        if self._first_token is None:
            self._first_token = time.perf_counter()
            metrics.TTFT_SECONDS.labels(*self._labels).observe(self._first_token - self._arrived)

    def finished(self, final: FinalChunk) -> None:
        """The request ended: count its tokens, its end-to-end time and time per output token."""
        labels, usage, ended = self._labels, final.usage, time.perf_counter()
        metrics.PROMPT_TOKENS.labels(*labels).inc(usage.prompt_tokens)
        metrics.GENERATION_TOKENS.labels(*labels).inc(usage.completion_tokens)
        metrics.REQUEST_SUCCESS.labels(*labels, final.finish_reason).inc()
        metrics.E2E_SECONDS.labels(*labels).observe(ended - self._arrived)
        if self._first_token is not None and usage.completion_tokens > 1:
            per_token_s = (ended - self._first_token) / (usage.completion_tokens - 1)
            metrics.TIME_PER_OUTPUT_TOKEN_SECONDS.labels(*labels).observe(per_token_s)
