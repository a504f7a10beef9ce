"""One OpenAI generate request in flight: its timer, its counts, and a stream's clean-up.

An ``Exchange`` starts its timer when the request arrives and counts the request
once, whichever way it ends (answered, refused, failed). An ``SseAnswer`` is the
body of a streamed answer, as httpx's response stream is: it yields the SSE
frames and ``close()`` (idempotent) releases the token stream, cancelling an
unfinished answer at its worker, and counts the stream's end (499 when its client
left before the last event). Leaving its
iteration closes it; so does its garbage collection, for a client gone before
the first byte, whose iteration never starts. Resolving and dispatching is
``frontend.generation``'s job, not this module's.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgspec
import structlog

from lorafleet.frontend.access_log import RequestRecord
from lorafleet.frontend.dispatcher import Completion
from lorafleet.frontend.errors import ClientGoneError, http_status, openai_error
from lorafleet.frontend.metrics import FrontendMetrics
from lorafleet.frontend.rollout_loop import AliasCall
from lorafleet.frontend.shapes import SSE_DONE, Answer, Shape, sse
from lorafleet.frontend.slo_meter import SloMeter
from lorafleet.frontend.token_stream import TokenStream
from lorafleet.proto.errors import LorafleetError
from lorafleet.proto.inference import FinalChunk, TokenChunk

__all__ = ["Exchange", "SseAnswer"]

log = structlog.get_logger(__name__)


class Exchange:
    """The metrics and access-log record of one generate request, timed from its arrival.

    ``label`` is the served model's name once known (``""`` before, as when the name
    resolves to nothing).
    """

    def __init__(
        self, metrics: FrontendMetrics, shape: Shape, record: RequestRecord,
        slo: SloMeter | None = None,
    ) -> None:  # fmt: skip
        self.metrics = metrics
        self.shape = shape
        self.record = record
        self.label = ""
        self.started = time.perf_counter()
        self.alias: AliasCall | None = None
        """The alias version this request went to, when it named an alias."""
        self._slo = slo
        """Counts an answered request's latencies against its adapter's targets, if any."""
        self._first_token_at: float | None = None
        self._broken = False
        """A stream that an error ended after its 200: no latency to judge."""

    @property
    def elapsed_s(self) -> float:
        """Seconds since the request arrived."""
        return time.perf_counter() - self.started

    def begin(self, answer: Answer) -> None:
        """Count the request in flight for ``answer``'s model, until ``end()``."""
        self.label = answer.model
        self.metrics.started(self.label, self.shape.endpoint)

    def end(self) -> None:
        """The request is no longer in flight (whatever its outcome)."""
        self.metrics.ended(self.label, self.shape.endpoint)

    def failed(self, exc: LorafleetError) -> None:
        """Count a request answered with ``exc``'s error status and the code its body
        gives (a worker's refusal of the client's request counts as the client's error)."""
        status, body = openai_error(exc)
        self.metrics.failed(self.label, self.shape.endpoint, body.error.code or exc.code)
        self.metrics.answered(self.label, self.shape.endpoint, status, self.elapsed_s)
        if self.alias is not None:
            self.alias.ended(status)

    def broke(self, exc: LorafleetError) -> None:
        """Count ``exc`` ending a stream that already answered 200."""
        self._broken = True
        status, body = openai_error(exc)
        self.metrics.failed(self.label, self.shape.endpoint, body.error.code or exc.code)
        if self.alias is not None:
            self.alias.ended(status)

    def client_left(self) -> None:
        """Count a stream whose client hung up before its end as 499, in the metrics and
        the access line, although its 200 head was sent (nginx's "client closed request")."""
        status = http_status(ClientGoneError.code)
        self.metrics.failed(self.label, self.shape.endpoint, ClientGoneError.code)
        self.metrics.answered(self.label, self.shape.endpoint, status, self.elapsed_s)
        self.record.status = status
        if self.alias is not None:
            self.alias.ended(status)

    def first_token(self, at: float | None = None) -> None:
        """Count the time to the first token, which came at ``at`` (``perf_counter``; now)."""
        self._first_token_at = time.perf_counter() if at is None else at
        seconds = self._first_token_at - self.started
        self.metrics.first_token_after(self.label, self.shape.endpoint, seconds)
        self.record.first_token_s = seconds
        if self.alias is not None:
            self.alias.first_token(seconds)

    def answered(self, final: FinalChunk | None = None) -> None:
        """Count a 200 answer; ``final``'s token counts go in the access log."""
        self.metrics.answered(self.label, self.shape.endpoint, 200, self.elapsed_s)
        if self.alias is not None:
            self.alias.ended(200)
        if final is not None:
            self.count_tokens(final)
        if self._slo is not None and self._first_token_at is not None and not self._broken:
            self._observe_latencies(self._slo, self._first_token_at)

    def _observe_latencies(self, slo: SloMeter, first_token_at: float) -> None:
        """Count the answer's TTFT and inter-token latency (from the first token to now,
        the last, over the tokens after the first) against its adapter's targets."""
        if self.label not in slo.targets():  # most adapters have none: nothing to work out
            return
        tokens = self.record.completion_tokens
        itl_s = (time.perf_counter() - first_token_at) / (tokens - 1) if tokens > 1 else None
        slo.observe(self.label, ttft_s=first_token_at - self.started, itl_s=itl_s)

    def count_tokens(self, final: FinalChunk) -> None:
        """Put the answer's token counts in the request's access-log record."""
        self.record.prompt_tokens = final.usage.prompt_tokens
        self.record.completion_tokens = final.usage.completion_tokens

    def whole(self, answer: Answer, completion: Completion) -> msgspec.Struct:
        """Count a whole answer and shape its body."""
        if completion.first_token_at is not None:
            self.first_token(completion.first_token_at)
        self.answered(completion.final)
        return self.shape.whole(answer, completion.text, completion.final, completion.logprobs)


class SseAnswer:
    """The SSE body of one streamed answer; ``close()`` releases it, once."""

    def __init__(
        self, exchange: Exchange, tokens: TokenStream, answer: Answer, *, include_usage: bool
    ) -> None:
        self._exchange = exchange
        self._tokens = tokens
        self._answer = answer
        self._include_usage = include_usage
        self._ended = False
        """The last event (``[DONE]``) is being sent: the client got the whole answer."""
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """The SSE events, written together when several are ready; closes at the end."""
        shape, answer = self._exchange.shape, self._answer
        opening = shape.opening(answer)
        batch = [opening] if opening else []
        try:
            async for chunk in self._tokens:
                batch += self._frames(chunk)
                if not self._tokens.buffered:
                    yield b"".join(batch)
                    batch.clear()
            batch.append(SSE_DONE)
            self._ended = True
            yield b"".join(batch)
        except LorafleetError as exc:
            log.warning("stream failed", model=answer.model, request=answer.id, error=exc.message)
            self._exchange.broke(exc)
            self._ended = True
            yield b"".join(batch) + sse(openai_error(exc)[1]) + SSE_DONE
        finally:
            self.close()

    def close(self) -> None:
        """Release the token stream (cancelling an unfinished answer) and count the end:
        a stream closed before its last event lost its client (499)."""
        if not self._closed:
            self._closed = True
            self._tokens.close()
            self._exchange.end()
            if self._ended:
                self._exchange.answered()
            else:
                log.info("client left mid-stream", model=self._answer.model,
                         request=self._answer.id)  # fmt: skip
                self._exchange.client_left()

    def __del__(self) -> None:
        self.close()  # a client gone before the first byte never starts the iteration

    def _frames(self, chunk: TokenChunk | FinalChunk) -> list[bytes]:
        shape, answer = self._exchange.shape, self._answer
        if isinstance(chunk, TokenChunk):
            return [shape.token(answer, chunk)]
        self._exchange.count_tokens(chunk)
        frames = [shape.finishing(answer, chunk)]
        if self._include_usage:
            frames.append(shape.usage(answer, chunk))
        return frames
