"""Serve one OpenAI generate request: resolve the model, dispatch, shape the answer, count it.

Shared by the chat and completions controllers. A stream's HTTP status is
decided before its first byte: errors up to the first chunk answer with their
status; later ones end the stream with an ``error`` event and ``[DONE]``.
A desired adapter that left its instances between lookup and dispatch (evicted,
instance gone) is loaded again on demand and the request dispatched once more.
A client that hangs up cancels its request at the worker, streamed or not.
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, TypeAlias, TypeVar

import msgspec
import structlog
from litestar.response import Stream
from litestar.types import Receive

from frontend.access_log import RequestRecord, current_record
from frontend.dispatcher import Dispatcher
from frontend.errors import ClientGoneError, NoLiveInstanceError, WorkerError, openai_error
from frontend.metrics import FrontendMetrics
from frontend.registry import ServedModel
from frontend.resolver import ModelResolver
from frontend.shapes import SSE_DONE, Answer, Shape, sse
from frontend.token_stream import TokenStream
from proto.errors import LorafleetError
from proto.inference import FinalChunk, GenerateRequest, TokenChunk
from proto.openai import ChatCompletionRequest, CompletionRequest

__all__ = [
    "GenerationService",
    "SSE_HEADERS",
    "ToGenerate",
]

log = structlog.get_logger(__name__)

SSE_HEADERS: Final = {
    # Litestar lets the handler's JSON media type win over Stream's own; a header does not.
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}

_Body = TypeVar("_Body", ChatCompletionRequest, CompletionRequest)
_Answer = TypeVar("_Answer")
ToGenerate: TypeAlias = Callable[[_Body, ServedModel, str], GenerateRequest]
"""Builds the request-plane message from a validated body, a served model and a request id."""


class GenerationService:
    """Turns validated OpenAI bodies into answers through the dispatcher."""

    def __init__(
        self, resolver: ModelResolver, dispatcher: Dispatcher, metrics: FrontendMetrics
    ) -> None:
        self.resolver = resolver
        self.dispatcher = dispatcher
        self.metrics = metrics

    async def generate(
        self, body: _Body, shape: Shape, to_generate: ToGenerate[_Body], receive: Receive
    ) -> msgspec.Struct | Stream:
        """Answer ``body`` whole or as an SSE stream; raises ``LorafleetError`` before streaming.

        ``receive`` is the request's ASGI channel, watched for the client hanging up.
        """
        started = time.perf_counter()
        current_record().model = body.model  # the name asked for, served or not
        served, request, answer = await self._prepare(body, shape, to_generate, started)
        self.metrics.started(answer.model, shape.endpoint)
        if body.stream:
            return await self._open_stream(served, request, shape, answer, body, started)
        return await self._whole(served, request, shape, answer, started, receive)

    async def _prepare(
        self, body: _Body, shape: Shape, to_generate: ToGenerate[_Body], started: float
    ) -> tuple[ServedModel, GenerateRequest, Answer]:
        """Resolve the model and build the request; failures are counted, then raised."""
        try:
            served = await self.resolver.resolve(body.model)
        except LorafleetError as exc:
            self._count_failure("", shape.endpoint, exc, started)
            raise
        # vLLM's answer id: the endpoint's prefix and the request id (x-request-id).
        answer_id = shape.id_prefix + current_record().request_id
        try:
            request = to_generate(body, served, answer_id)
        except LorafleetError as exc:
            self._count_failure(served.name, shape.endpoint, exc, started)
            raise
        logprobs = request.sampling.logprobs is not None
        answer = Answer(
            id=answer_id, created=int(time.time()), model=served.name, logprobs=logprobs
        )
        return served, request, answer

    async def _whole(
        self,
        served: ServedModel,
        request: GenerateRequest,
        shape: Shape,
        answer: Answer,
        started: float,
        receive: Receive,
    ) -> msgspec.Struct:
        try:
            completion = await _unless_client_gone(
                self._dispatch(self.dispatcher.complete, served, request),
                receive,
                ClientGoneError(answer.model, answer.id),
            )
        except LorafleetError as exc:
            self._count_failure(answer.model, shape.endpoint, exc, started)
            raise
        finally:
            self.metrics.ended(answer.model, shape.endpoint)
        if completion.first_token_at is not None:
            first_token_s = completion.first_token_at - started
            self.metrics.first_token_after(answer.model, shape.endpoint, first_token_s)
        self.metrics.answered(answer.model, shape.endpoint, 200, time.perf_counter() - started)
        _count_tokens(completion.final, current_record())
        return shape.whole(answer, completion.text, completion.final, completion.logprobs)

    async def _open_stream(
        self,
        served: ServedModel,
        request: GenerateRequest,
        shape: Shape,
        answer: Answer,
        body: ChatCompletionRequest | CompletionRequest,
        started: float,
    ) -> Stream:
        try:
            stream = functools.partial(self.dispatcher.stream, lookup=self.resolver.registry.get)
            tokens = await self._dispatch(stream, served, request)
        except BaseException as exc:
            self.metrics.ended(answer.model, shape.endpoint)
            if isinstance(exc, LorafleetError):
                self._count_failure(answer.model, shape.endpoint, exc, started)
            raise
        if isinstance(tokens.first, TokenChunk):
            self.metrics.first_token_after(
                answer.model, shape.endpoint, time.perf_counter() - started
            )
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        release = self._releaser(tokens, shape, answer, started)
        count = functools.partial(_count_tokens, record=current_record())
        frames = self._frames(tokens, shape, answer, include_usage, release, count)
        # A client gone before the first byte may leave the generator never started, so
        # its ``finally`` never runs: releasing on garbage collection covers that case.
        weakref.finalize(frames, release)
        return Stream(frames, media_type="text/event-stream", headers=SSE_HEADERS)

    async def _dispatch(
        self,
        call: Callable[[ServedModel, GenerateRequest], Awaitable[_Answer]],
        served: ServedModel,
        request: GenerateRequest,
    ) -> _Answer:
        """``call`` the dispatcher; once more after loading a desired adapter that went cold."""
        try:
            return await call(served, request)
        except (WorkerError, NoLiveInstanceError) as exc:
            spec = self.resolver.gone_cold(served, exc)
            if spec is None:
                raise
        log.info("adapter left its instances; loading it again", adapter=served.name)
        return await call(await self.resolver.loader.load(spec), request)

    def _releaser(
        self, tokens: TokenStream, shape: Shape, answer: Answer, started: float
    ) -> Callable[[], None]:
        """Close ``tokens`` (cancelling an unfinished answer) and count the stream, once."""
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                tokens.close()
                elapsed_s = time.perf_counter() - started
                self.metrics.ended(answer.model, shape.endpoint)
                self.metrics.answered(answer.model, shape.endpoint, 200, elapsed_s)

        return release

    async def _frames(
        self,
        tokens: TokenStream,
        shape: Shape,
        answer: Answer,
        include_usage: bool,
        release: Callable[[], None],
        count: Callable[[FinalChunk], None],
    ) -> AsyncIterator[bytes]:
        """The SSE events of one stream, written together when several are ready; released."""
        opening = shape.opening(answer)
        batch = [opening] if opening else []
        try:
            async for chunk in tokens:
                if isinstance(chunk, TokenChunk):
                    batch.append(shape.token(answer, chunk))
                elif isinstance(chunk, FinalChunk):
                    count(chunk)
                    batch.append(shape.finishing(answer, chunk))
                    if include_usage:
                        batch.append(shape.usage(answer, chunk))
                if not tokens.buffered:
                    yield b"".join(batch)
                    batch.clear()
            batch.append(SSE_DONE)
            yield b"".join(batch)
        except LorafleetError as exc:
            log.warning("stream failed", model=answer.model, request=answer.id, error=exc.message)
            self.metrics.failed(answer.model, shape.endpoint, exc.code)
            yield b"".join(batch) + sse(openai_error(exc)[1]) + SSE_DONE
        finally:
            release()

    def _count_failure(
        self, label: str, endpoint: str, exc: LorafleetError, started: float
    ) -> None:
        status, _body = openai_error(exc)
        self.metrics.failed(label, endpoint, exc.code)
        self.metrics.answered(label, endpoint, status, time.perf_counter() - started)


def _count_tokens(final: FinalChunk, record: RequestRecord) -> None:
    """Put the answer's token counts in the request's access-log record."""
    record.prompt_tokens = final.usage.prompt_tokens
    record.completion_tokens = final.usage.completion_tokens


async def _until_disconnected(receive: Receive) -> None:
    """Return when the client hangs up: once the body is read, the next ASGI message
    on the request's channel is ``http.disconnect``."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_client_gone(
    work: Awaitable[_Answer], receive: Receive, gone: ClientGoneError
) -> _Answer:
    """Await ``work``; cancel it (and so its request at the worker) and raise ``gone`` if the
    client hangs up first. Without this a dropped client's answer is generated to the end."""
    handler = asyncio.current_task()
    assert handler is not None  # called from a request handler's task
    hung_up = False

    async def watch() -> None:
        nonlocal hung_up
        await _until_disconnected(receive)
        hung_up = True
        handler.cancel()

    watcher = asyncio.create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not hung_up:
            raise
        handler.uncancel()
        raise gone from None
    finally:
        watcher.cancel()
