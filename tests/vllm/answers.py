"""Helpers of the vLLM tests: run one request through an engine and collect what streams back."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from lorafleet.proto.inference import (
    ChatMessage,
    FinalChunk,
    GenerateRequest,
    SamplingParams,
    TokenChunk,
)

_ids = itertools.count()


@dataclass(frozen=True)
class Answer:
    """The text deltas of one request and its final chunk."""

    chunks: list[TokenChunk]
    final: FinalChunk

    @property
    def text(self) -> str:
        return "".join(chunk.text for chunk in self.chunks)


def chat(model: str, prompt: str, **sampling: Any) -> GenerateRequest:
    """A greedy chat request with one user message (sampling settings may override)."""
    params = SamplingParams(**{"max_tokens": 48, "temperature": 0.0, **sampling})
    return GenerateRequest(
        request_id=f"test-{next(_ids)}",
        model=model,
        messages=[ChatMessage(role="user", content=prompt)],
        sampling=params,
    )


async def answer(engine: Any, request: GenerateRequest) -> Answer:
    """Run ``request`` to its end."""
    chunks: list[TokenChunk] = []
    async for chunk in engine.generate(request):
        if isinstance(chunk, FinalChunk):
            return Answer(chunks=chunks, final=chunk)
        chunks.append(chunk)
    raise AssertionError(f"stream of {request.request_id} ended without a FinalChunk")
