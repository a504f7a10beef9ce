"""A streamed answer that outlives its worker: lost mid-stream, it continues on another instance.

When the instance of a stream that already sent tokens is lost (no responder,
a stall with a failed ping) or ends it with a retryable error, the stream is
*migrated*: the same request goes to another instance serving the model, with
the token ids the client already received as ``generated_ids`` and
``max_tokens`` lowered by as many. The engine continues after them, so the
client reads one uninterrupted stream; ``usage`` is made whole here. At most
``DispatchSettings.migration_limit`` migrations per request, then the stream
ends with an error event as before. Token ids, not text, make greedy answers
exact (``docs/decisions.md``).
"""

from __future__ import annotations

from array import array
from collections.abc import AsyncIterator, Callable
from typing import TypeAlias

import msgspec
import structlog

from lorafleet.frontend.attempt import Attempt, Attempts
from lorafleet.frontend.errors import InstanceLostError, WorkerError
from lorafleet.frontend.registry import ServedModel
from lorafleet.proto.errors import UpstreamError, error_from_info
from lorafleet.proto.inference import (
    ErrorChunk,
    FinalChunk,
    GenerateRequest,
    StreamChunk,
    TokenChunk,
    Usage,
)

__all__ = ["Lookup", "TokenStream"]

Lookup: TypeAlias = Callable[[str], ServedModel | None]
"""The served model of a name as the registry knows it now, or None (``ModelRegistry.get``)."""

log = structlog.get_logger(__name__)


class TokenStream:
    """The chunks of a streamed answer; the first one already arrived. ``close()`` when done."""

    def __init__(
        self,
        attempts: Attempts,
        served: ServedModel,
        request: GenerateRequest,
        attempt: Attempt,
        first: StreamChunk,
        lookup: Lookup | None = None,
    ) -> None:
        self._attempts = attempts
        self._served = served
        self._lookup = lookup
        self._origin = request
        self._request = request
        self._attempt = attempt
        self.request_id = request.request_id
        self.first = first
        self.migrations = 0
        self._ids = array("q")
        """Token ids the client received, from every instance so far (8 bytes each)."""
        self._tokens = 0
        self._done = False

    async def __aiter__(self) -> AsyncIterator[TokenChunk | FinalChunk]:
        """Yield token chunks and the final chunk; raise a ``LorafleetError`` on failure."""
        chunk = self.first
        while True:
            if isinstance(chunk, ErrorChunk):
                lost = self._attempt.instance.instance_id
                chunk = await self._migrate(WorkerError(lost, error_from_info(chunk.error)))
                continue
            if isinstance(chunk, FinalChunk):
                self._done = True
                yield self._whole(chunk)
                return
            self._ids.extend(chunk.token_ids)
            self._tokens += chunk.tokens
            yield chunk
            try:
                chunk = await self._attempts.next_chunk(self._attempt)
            except InstanceLostError as exc:
                chunk = await self._migrate(exc)

    @property
    def buffered(self) -> bool:
        """Whether more chunks already arrived, so the next step will not wait."""
        return self._attempt.reply.pending > 0

    def close(self) -> None:
        """Release the attempt; if the answer did not finish, cancel it at the worker."""
        self._attempts.release(self._attempt)
        if not self._done:
            self._done = True
            self._attempts.cancel(self._attempt)

    async def _migrate(self, exc: InstanceLostError | WorkerError) -> StreamChunk:
        """Continue on another instance after ``exc`` and return its first chunk, or raise."""
        lost = self._attempt
        self._attempts.release(lost)
        refusal = self._refusal(exc)
        if refusal is not None:
            self._done = True
            raise refusal
        self._attempts.abandon(exc, lost)
        self._request = self._continuation()
        if self._lookup is not None:  # instances may have come and gone since the start
            self._served = self._lookup(self._served.name) or self._served
        try:
            self._attempt, first = await self._attempts.first_chunk(self._served, self._request)
        except BaseException:
            self._done = True
            raise
        self.migrations += 1
        self._attempts.metrics.migrated(self._served.name)
        log.warning(
            "stream migrated", request=self.request_id, model=self._served.name,
            lost=f"{lost.instance.instance_id:x}", to=f"{self._attempt.instance.instance_id:x}",
            reason=exc.message, generated_tokens=len(self._ids), migration=self.migrations,
        )  # fmt: skip
        return first

    def _refusal(self, exc: InstanceLostError | WorkerError) -> WorkerError | None:
        """The error that ends the stream, or None when it may migrate."""
        if isinstance(exc, WorkerError):
            if not exc.retryable:
                return exc
            reason, instance_id = exc.error.message, exc.instance_id
        else:
            reason, instance_id = exc.reason, exc.instance_id
        limit = self._attempts.migration_limit
        if self.migrations >= limit:
            why = f"after {self.migrations} migrations (DYN_MIGRATION_LIMIT={limit})"
        elif len(self._ids) != self._tokens:
            why = "its engine sent no token ids to continue from"
        else:
            return None
        lost = UpstreamError(f"it stopped answering mid-stream ({reason}); gave up {why}")
        return WorkerError(instance_id, lost)

    def _continuation(self) -> GenerateRequest:
        """The original request, resuming after the tokens sent, with what is left of its budget."""
        left = max(0, self._origin.sampling.max_tokens - len(self._ids))
        sampling = msgspec.structs.replace(self._origin.sampling, max_tokens=left)
        return msgspec.structs.replace(
            self._origin, generated_ids=list(self._ids), sampling=sampling
        )

    def _whole(self, final: FinalChunk) -> FinalChunk:
        """``final`` with usage of the whole answer: the engine counted only its own tokens."""
        if not self._request.generated_ids:
            return final
        done = len(self._request.generated_ids) + final.usage.completion_tokens
        usage = Usage(prompt_tokens=final.usage.prompt_tokens, completion_tokens=done)
        return msgspec.structs.replace(final, usage=usage)
