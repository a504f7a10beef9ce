"""The mocker's prefill: cached blocks are free, every other prompt token costs time, one
prefill at a time per engine, so a mocker's TTFT depends on its cache hits and on its load.

Tokens are the fleet's word tokens (``fleet.kv_blocks.words_tokens``) of the prompt, or of
each chat message's content in order; a finished answer's words are cached after its
prompt, so a chat's next turn, which resends the answer, finds the whole conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from lorafleet.fleet.kv_blocks import HASH_BYTES, block_hashes, words_tokens
from lorafleet.proto.inference import GenerateRequest
from lorafleet.proto.kv_events import KvCacheSpec, KvEvent
from lorafleet.worker import metrics
from lorafleet.worker.engine import KvEventSink
from lorafleet.worker.engines._kv_cache import KvCache

__all__ = ["MockerPrefill", "PrefillAnswer", "prompt_tokens"]


def prompt_tokens(request: GenerateRequest) -> list[int]:
    """The mocker's tokens of a request's prompt or chat messages."""
    if request.messages is not None:
        return words_tokens(message.content for message in request.messages)
    return words_tokens([request.prompt or ""])


@dataclass
class PrefillAnswer:
    """What one prefill tells its request: its prompt's tokens, those found cached (None:
    no cache), and the answer's text as it is generated (cached after the prompt)."""

    prompt_tokens: int
    cached_tokens: int | None
    text: list[str] = field(default_factory=list)


def _ignore(_: KvEvent) -> None:
    pass


class MockerPrefill:
    """The mocker's KV cache (None when ``num_blocks`` is 0) and its prefill clock.

    Example::

        prefill = MockerPrefill(model_name="demo", block_size=16, num_blocks=2048,
                                time_per_token_s=0.0001)
        async with prefill.run(request, version="pirate@sha256:0a1b", lora_name="pirate") as out:
            out.text.append("pirate:0 ")                # the answer's text, cached at the end
    """

    def __init__(
        self, *, model_name: str, block_size: int, num_blocks: int, time_per_token_s: float
    ) -> None:
        self._model_name = model_name
        self._time_per_token_s = time_per_token_s
        self._sink: KvEventSink = _ignore
        self.cache = (
            KvCache(block_size=block_size, num_blocks=num_blocks, sink=self._emit)
            if num_blocks
            else None
        )
        self._prefilling = asyncio.Lock()
        """One prefill at a time, as an engine step computes one batch of prompts."""

    def spec(self) -> KvCacheSpec | None:
        """The cache as routers see it, None when it is off."""
        if self.cache is None:
            return None
        return KvCacheSpec(block_size=self.cache.block_size, num_blocks=self.cache.num_blocks)

    def publish_to(self, sink: KvEventSink) -> None:
        """Send the cache's events to ``sink`` from now on."""
        self._sink = sink

    def _emit(self, event: KvEvent) -> None:
        self._sink(event)

    @contextlib.asynccontextmanager
    async def run(
        self, request: GenerateRequest, *, version: str, lora_name: str
    ) -> AsyncIterator[PrefillAnswer]:
        """Prefill ``request`` (its blocks pinned until the block ends), then collect its
        answer's text; a complete first answer's blocks are cached after its prompt's."""
        tokens, cache = prompt_tokens(request), self.cache
        if cache is None:
            metrics.observe_prefix_cache(self._model_name, lora_name, len(tokens), 0)
            await self._prefill(len(tokens))
            yield PrefillAnswer(prompt_tokens=len(tokens), cached_tokens=None)
            return
        hashes = block_hashes(tokens, cache.block_size, version, request.cache_salt)
        held = cache.hold(version, hashes)
        hit_tokens = held.hits * cache.block_size
        metrics.observe_prefix_cache(self._model_name, lora_name, len(tokens), hit_tokens)
        try:
            await self._prefill(len(tokens) - hit_tokens)
            answer = PrefillAnswer(prompt_tokens=len(tokens), cached_tokens=hit_tokens)
            yield answer
            if not request.generated_ids:  # a continuation's earlier tokens have no text here
                tail = [*tokens[len(hashes) * cache.block_size :], *words_tokens(answer.text)]
                self._store_after(cache, version, request.cache_salt, hashes, tail)
        finally:
            cache.release(held.pinned)

    async def _prefill(self, uncached_tokens: int) -> None:
        """Spend the prefill's time, one prefill at a time."""
        async with self._prefilling:
            await asyncio.sleep(uncached_tokens * self._time_per_token_s)

    @staticmethod
    def _store_after(
        cache: KvCache, version: str, salt: str, hashes: list[int], tail: list[int]
    ) -> None:
        """Cache the whole blocks ``tail`` makes after the chain ``hashes`` (then idle)."""
        start = hashes[-1].to_bytes(HASH_BYTES, "little", signed=True) if hashes else b""
        more = block_hashes(tail, cache.block_size, version, salt, start=start)
        cache.release(cache.hold(version, more).pinned)
