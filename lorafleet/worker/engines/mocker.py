"""The mocker engine: no weights, synthetic tokens at a set rate, adapters by name.

It runs every worker and LoRA path without a model, and injects delays and
failures on request so that rollback and start-up failures are testable.
Its text names the model that produced it (``pirate:0 pirate:1 ...``), so a
test can tell whether the right adapter answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from lorafleet.fleet.adapter_files import check_adapter_rank
from lorafleet.fleet.kv_blocks import version_key
from lorafleet.proto.errors import InvalidRequestError, UpstreamError
from lorafleet.proto.inference import (
    FinalChunk,
    FinishReason,
    GenerateRequest,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from lorafleet.proto.kv_events import KvCacheSpec
from lorafleet.worker import metrics
from lorafleet.worker.adapter_engine import AdapterEngine
from lorafleet.worker.engine import EngineConfig, KvEventSink, ModelEndpoint
from lorafleet.worker.engines._adapter_table import AdapterTable
from lorafleet.worker.engines._mocker_prefill import MockerPrefill, PrefillAnswer

__all__ = ["MockAdapter", "MockerEngine", "MockerOptions"]

UNLIKELY_LOGPROB: Final = -9999.0
"""OpenAI's stand-in for an impossible token's log probability (JSON has no -inf)."""


@dataclass(frozen=True, kw_only=True)
class MockerOptions:
    """Knobs of the mocker, read from ``EngineConfig.options``.

    Examples::

        MockerOptions()                                  # instant tokens
        MockerOptions(time_per_token_s=0.01)             # 100 tokens/s per request
        MockerOptions(fail_add_adapter="broken.*")       # adding matching adapters fails
        MockerOptions(fail_generate="bot-v2", fail_generate_share=0.3)  # 3 of 10 requests fail
        MockerOptions(time_per_token_s=0.02, max_running=2)  # a queue past 2 requests
        MockerOptions(kv_cache_blocks=0, prefill_time_per_token_s=0)  # no cache, no prefill
    """

    time_per_token_s: float = 0.0
    output_tokens: int = 64
    endpoint_ready_delay_s: float = 0.0
    fail_on_endpoint_ready: bool = False
    add_adapter_delay_s: float = 0.0
    fail_add_adapter: str = ""
    fail_remove_adapter: str = ""
    fail_generate: str = ""
    """Requests to models whose name matches fail before their first token, ..."""
    fail_generate_share: float = 1.0
    """... this share of them, spread evenly (request n fails when n x share crosses an integer),
    so a run is the same every time."""
    max_running: int = 0
    """Requests generated at once (0: no limit); the others wait their turn in arrival
    order, as in a busy engine's queue, so load on one copy lengthens TTFT (``bench.slo``)."""
    name_version: bool = False
    """An adapter's tokens name the version that answers (``name@<12 hex of its digest>``)
    instead of the adapter: ``bench.rollout`` tells old from new weights in a swap by it."""
    block_size: int = 16
    """Tokens (prompt words) per KV cache block."""
    kv_cache_blocks: int = 2048
    """Blocks the paged KV cache holds (0: no cache, no block events); idle blocks are
    evicted least recently used first."""
    prefill_time_per_token_s: float = 0.0001
    """Seconds of prefill per prompt token not found in the cache, one prefill at a time:
    a 2,000-word prompt waits 0.2 s for its first token unless its blocks are cached."""

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> MockerOptions:
        """Pick the mocker's keys out of the engine options (others are ignored)."""
        known = cls.__dataclass_fields__.keys()
        return cls(**{key: value for key, value in options.items() if key in known})


@dataclass(frozen=True, kw_only=True)
class MockAdapter:
    """The mocker's handle of one adapter version: no weights, its key and id."""

    key: str
    lora_id: int
    version: str
    """Its blocks' version (``fleet.kv_blocks.version_key``: name and full digest)."""


class MockerEngine(AdapterEngine):
    """Streams ``{model}:{i}`` tokens for the base model and the adapters it was given."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        options = {"time_per_token_s": config.mocker_time_per_token_s, **config.options}
        self.options = MockerOptions.from_options(options)
        self.adapters: AdapterTable[MockAdapter] = AdapterTable()
        """The engine's handles by version key (``name@digest``; the controller keeps the
        slots), and the requests running on each, to end them on removal."""
        self._ids = itertools.count()
        self.requests_by_model: dict[str, int] = {}
        """Requests seen per model that ``fail_generate`` matches (which of them fail)."""
        self.endpoint: ModelEndpoint | None = None
        self._running = (
            asyncio.Semaphore(self.options.max_running) if self.options.max_running else None
        )
        self.prefill = MockerPrefill(
            model_name=self.config.model_name, block_size=self.options.block_size,
            num_blocks=self.options.kv_cache_blocks,
            time_per_token_s=self.options.prefill_time_per_token_s,
        )  # fmt: skip

    def kv_cache_spec(self) -> KvCacheSpec | None:
        """The paged cache's shape (None when ``kv_cache_blocks`` is 0)."""
        return self.prefill.spec()

    def publish_kv_events(self, sink: KvEventSink) -> None:
        """Send the cache's block events to ``sink`` (the worker's relay)."""
        self.prefill.publish_to(sink)

    async def on_endpoint_ready(self, endpoint: ModelEndpoint) -> None:
        """Keep the endpoint; optionally wait or fail, as a slow or broken engine would."""
        await asyncio.sleep(self.options.endpoint_ready_delay_s)
        if self.options.fail_on_endpoint_ready:
            raise UpstreamError("mocker: on_endpoint_ready failed as configured")
        self.endpoint = endpoint
        await super().on_endpoint_ready(endpoint)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | FinalChunk]:
        """Stream up to ``max_tokens`` synthetic tokens for the base model or a loaded adapter.

        Token ``i`` has id ``i``, so a continuation (``generated_ids``) resumes at the
        index after them, as a real engine resumes after its given tokens. Every token is
        certain (log probability 0); penalties change nothing in synthetic text. Its answer
        ends after ``output_tokens`` as a model's ends at eos: ``ignore_eos`` goes on to
        ``max_tokens``, ``min_tokens`` to at least that many. ``logit_bias`` is refused: no
        bias could change synthetic text. A request whose adapter version is removed under
        it ends at its next token with ``unloaded_error``.
        """
        if request.sampling.logit_bias:
            raise InvalidRequestError(
                f"request {request.request_id}: logit_bias is not supported by the mocker "
                "engine: its text is synthetic"
            )
        handle = self.resolve(request.model, self.adapters.handles)
        key = request.model if handle is None else handle.key
        version = version_key(request.model) if handle is None else handle.version
        self._maybe_fail(request.model)
        answering = key if self.options.name_version else request.model
        adapter = "" if request.model == self.config.model_name else request.model
        queued_at = time.perf_counter()
        async with self._running or contextlib.nullcontext():
            queued_s = time.perf_counter() - queued_at
            metrics.QUEUE_SECONDS.labels(self.config.model_name, adapter).observe(queued_s)
            async with self.prefill.run(request, version=version, lora_name=adapter) as answer:
                async for chunk in self._tokens(request, key, answering, answer):
                    if isinstance(chunk, TokenChunk):
                        answer.text.append(chunk.text)
                    yield chunk

    async def _tokens(
        self, request: GenerateRequest, key: str, answering: str, prefill: PrefillAnswer
    ) -> AsyncIterator[TokenChunk | FinalChunk]:
        """The answer's synthetic tokens, one per ``time_per_token_s``, then its final chunk;
        ``key``: the adapter version it runs on (or the base model); ``prefill``: its prompt
        and cached tokens."""
        start = len(request.generated_ids)
        budget = max(0, min(request.sampling.max_tokens, self._natural_length(request) - start))
        run_id = f"{request.request_id}-{next(self._ids)}"
        async with self.adapters.tracked(key, run_id):
            for index in range(start, start + budget):
                await asyncio.sleep(self.options.time_per_token_s)
                if self.adapters.was_cut(run_id):
                    raise self.unloaded_error(key, request.request_id)
                text = f"{answering}:{index} "
                logprobs = _logprobs(text, request.sampling.logprobs)
                yield TokenChunk(text=text, token_ids=[index], logprobs=logprobs)
        finish: FinishReason = "length" if budget == request.sampling.max_tokens else "stop"
        yield FinalChunk(
            finish_reason=finish,
            usage=Usage(
                prompt_tokens=prefill.prompt_tokens,
                completion_tokens=budget,
                cached_tokens=prefill.cached_tokens,
            ),
        )

    def _maybe_fail(self, model: str) -> None:
        """Fail this request to ``model`` if ``fail_generate`` says its turn has come."""
        pattern, share = self.options.fail_generate, self.options.fail_generate_share
        if not pattern or not re.fullmatch(pattern, model):
            return
        seen = self.requests_by_model.get(model, 0)
        self.requests_by_model[model] = seen + 1
        if math.floor((seen + 1) * share) > math.floor(seen * share):
            raise UpstreamError(f"mocker: request {seen + 1} to {model!r} failed as configured")

    def _natural_length(self, request: GenerateRequest) -> int:
        """Where the answer ends by itself: ``output_tokens``, eos held back as asked."""
        sampling = request.sampling
        if sampling.ignore_eos:
            return len(request.generated_ids) + sampling.max_tokens
        return max(self.options.output_tokens, sampling.min_tokens)

    async def add_adapter(self, name: str, lora_id: int, path: Path) -> None:
        """Serve ``name`` from now on (after the configured delay, unless configured to fail);
        like hf and vllm, refuse one whose rank exceeds ``--max-lora-rank``."""
        check_adapter_rank(_name(name), path, self.config.max_lora_rank)
        await asyncio.sleep(self.options.add_adapter_delay_s)
        if _matches(self.options.fail_add_adapter, name):
            raise UpstreamError(f"mocker: adding adapter {_name(name)!r} failed as configured")
        version = self.kv_version(name)
        self.adapters.handles[name] = MockAdapter(key=name, lora_id=lora_id, version=version)

    async def remove_adapter(self, name: str) -> None:
        """Stop serving ``name``; the requests still running on it end at their next token."""
        if _matches(self.options.fail_remove_adapter, name):
            raise UpstreamError(f"mocker: removing adapter {_name(name)!r} failed as configured")
        handle = self.adapters.handles.pop(name)
        self.adapters.cut(name)
        if self.prefill.cache is not None:
            self.prefill.cache.clear(handle.version)


def _name(key: str) -> str:
    """The adapter name of version ``key`` (``name@digest``)."""
    return key.partition("@")[0]


def _matches(pattern: str, key: str) -> bool:
    """Whether a fault pattern names the adapter of version ``key``."""
    return bool(pattern) and re.fullmatch(pattern, _name(key)) is not None


def _logprobs(text: str, top: int | None) -> list[TokenLogprob]:
    """The mocker's certain token, and as many alternatives as asked, all but it impossible."""
    if top is None:
        return []
    others = [TopLogprob(token=f"<alt{rank}>", logprob=UNLIKELY_LOGPROB) for rank in range(1, top)]
    alternatives = [TopLogprob(token=text, logprob=0.0), *others][:top]
    return [TokenLogprob(token=text, logprob=0.0, top=alternatives)]
