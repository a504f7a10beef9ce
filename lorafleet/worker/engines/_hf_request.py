"""One request in the hf engine: its prompt tokens, batch row, text stream and outgoing chunks.

Lives on the event loop; turns each new token into ``TokenChunk``s and a
closing ``FinalChunk`` (or an error) that the caller's stream reads. The
model thread may already have appended later tokens to the row: only the
first ``delivered`` of them are this request's so far.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from lorafleet.proto.errors import InvalidRequestError, LorafleetError
from lorafleet.proto.inference import (
    FinalChunk,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from lorafleet.worker.engines._hf_batch import Row, RowState
from lorafleet.worker.engines._hf_text import TextStream

__all__ = ["InFlight", "Outcome", "check_sampling", "prompt_ids"]

Outcome = TokenChunk | FinalChunk | LorafleetError


def prompt_ids(tokenizer: Any, request: GenerateRequest) -> list[int]:
    """Token ids of the prompt: the chat template for ``messages``, raw text for ``prompt``."""
    if (request.prompt is None) == (request.messages is None):
        raise InvalidRequestError(
            f"request {request.request_id}: exactly one of prompt and messages must be given"
        )
    if request.messages is not None:
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        ids = tokenizer.encode(request.prompt)
    if not ids:
        raise InvalidRequestError(f"request {request.request_id} has an empty prompt")
    return list(ids)


def check_sampling(request_id: str, params: SamplingParams, vocab_size: int) -> None:
    """Refuse sampling settings no sampler can honour, naming the field."""
    outside = [token for token in params.logit_bias if not 0 <= token < vocab_size]
    if outside:
        raise InvalidRequestError(
            f"request {request_id}: logit_bias names token {outside[0]}, outside the "
            f"model's vocabulary of {vocab_size} tokens"
        )
    if params.max_tokens < 1:
        raise InvalidRequestError(f"request {request_id}: max_tokens must be at least 1")
    if params.temperature < 0:
        raise InvalidRequestError(f"request {request_id}: temperature must not be negative")
    if not 0 < params.top_p <= 1:
        raise InvalidRequestError(f"request {request_id}: top_p must be in (0, 1]")
    if params.repetition_penalty <= 0:
        raise InvalidRequestError(f"request {request_id}: repetition_penalty must be above 0")


@dataclass(eq=False, kw_only=True)
class InFlight:
    """A request between admission and its last chunk."""

    request_id: str
    model: str
    row: Row
    text: TextStream
    max_new_tokens: int
    prompt_tokens: int
    """The request's own prompt, without the tokens a continuation resumes after."""
    tokenizer: Any = None
    """Names tokens in log probabilities (only needed when the request asks for them)."""
    outbox: asyncio.Queue[Outcome] = field(default_factory=asyncio.Queue)
    delivered: int = 0
    """How many of the row's output tokens this request has taken."""
    unsent_tokens: int = 0
    queued_at: float = field(default_factory=time.perf_counter)

    @property
    def done(self) -> bool:
        """Finished, failed or cancelled: the batch should drop its row."""
        return self.row.state is RowState.DONE

    def deliver(self, token: int, eos_ids: Collection[int]) -> None:
        """Take one new token; finish on eos, a stop string or ``max_new_tokens``."""
        if self.done:
            return
        self.delivered += 1
        self.unsent_tokens += 1
        if token in eos_ids:
            self._finish("stop", self.text.flush())
            return
        text = self.text.push(token)
        if self.text.stopped:
            self._finish("stop", text)
        elif self.delivered >= self.max_new_tokens:
            self._finish("length", text + self.text.flush())
        elif text:
            self._send(text)

    def fail(self, error: LorafleetError) -> None:
        """End the stream with ``error`` unless it already ended."""
        if not self.done:
            self.outbox.put_nowait(error)
            self.row.state = RowState.DONE

    def end_exhausted(self) -> None:
        """End at once with ``length``: a continuation whose token budget is already spent."""
        self._finish("length", "")

    def _send(self, text: str) -> None:
        ids = self.row.output_ids[self.delivered - self.unsent_tokens : self.delivered]
        logprobs = self._logprobs(ids)
        chunk = TokenChunk(text=text, tokens=self.unsent_tokens, token_ids=ids, logprobs=logprobs)
        self.outbox.put_nowait(chunk)
        self.unsent_tokens = 0

    def _logprobs(self, ids: list[int]) -> list[TokenLogprob]:
        """The log probabilities of ``ids``, the newest output tokens, if the row scored them."""
        if self.row.params.logprobs is None:
            return []
        scores = self.row.scores[self.delivered - len(ids) : self.delivered]
        return [
            TokenLogprob(
                token=self._token(token_id),
                logprob=logprob,
                top=[TopLogprob(token=self._token(i), logprob=value) for i, value in top],
            )
            for token_id, (logprob, top) in zip(ids, scores, strict=True)
        ]

    def _token(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))

    def _finish(self, reason: FinishReason, text: str) -> None:
        if text:
            self._send(text)
        usage = Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.delivered)
        self.outbox.put_nowait(FinalChunk(finish_reason=reason, usage=usage))
        self.row.state = RowState.DONE
