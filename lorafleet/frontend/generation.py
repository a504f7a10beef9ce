"""Serve one OpenAI generate request: resolve the model, dispatch, shape the answer, count it.

Shared by the chat and completions controllers. A stream's HTTP status is
decided before its first byte: errors up to the first chunk answer with their
status; later ones end the stream with an ``error`` event and ``[DONE]``.
A desired adapter that left its instances between lookup and dispatch (evicted,
instance gone) is loaded again on demand and the request dispatched once more.
A client that hangs up cancels its request (at the worker, once sent), whether it waits for
a load, an instance, its first token or its whole answer, and is counted as 499.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeAlias, TypeVar

import msgspec
import structlog
from litestar.types import Receive

from lorafleet.frontend.access_log import current_record
from lorafleet.frontend.dispatcher import Dispatcher
from lorafleet.frontend.errors import ClientGoneError, NoLiveInstanceError, WorkerError
from lorafleet.frontend.exchange import Exchange, SseAnswer
from lorafleet.frontend.metrics import FrontendMetrics
from lorafleet.frontend.registry import ServedModel
from lorafleet.frontend.resolver import ModelResolver
from lorafleet.frontend.rollout_loop import RolloutLoop
from lorafleet.frontend.shapes import Answer, Shape
from lorafleet.frontend.slo_meter import SloMeter
from lorafleet.frontend.token_stream import TokenStream
from lorafleet.proto.errors import LorafleetError
from lorafleet.proto.inference import GenerateRequest, TokenChunk
from lorafleet.proto.openai import ChatCompletionRequest, CompletionRequest

__all__ = [
    "GenerationService",
    "SSE_HEADERS",
    "SSE_MEDIA_TYPE",
    "ToGenerate",
    "WATCH_AFTER_S",
]

log = structlog.get_logger(__name__)

SSE_MEDIA_TYPE: Final = "text/event-stream"
SSE_HEADERS: Final = {
    # Litestar lets the handler's JSON media type win over Stream's own; a header does not.
    "Content-Type": f"{SSE_MEDIA_TYPE}; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}

COLD_RELOADS: Final = 3
"""Loads of an adapter that left its instances, per request: a slot contested by other
loads can take it again between its load and the request's dispatch."""
WATCH_AFTER_S: Final = 0.1
"""How long a whole answer runs before the frontend starts watching for its client hanging
up: a hang-up sooner cancels the request at the worker this late at most."""

_Body = TypeVar("_Body", ChatCompletionRequest, CompletionRequest)
_Answer = TypeVar("_Answer")
ToGenerate: TypeAlias = Callable[[_Body, ServedModel, str], GenerateRequest]
"""Builds the request-plane message from a validated body, a served model and a request id."""


class GenerationService:
    """Turns validated OpenAI bodies into answers through the dispatcher."""

    def __init__(
        self,
        resolver: ModelResolver,
        dispatcher: Dispatcher,
        metrics: FrontendMetrics,
        rollouts: RolloutLoop | None = None,
        slo: SloMeter | None = None,
    ) -> None:
        self.resolver = resolver
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.rollouts = rollouts
        """Splits requests to an alias over its versions and counts them (None: no aliases)."""
        self.slo = slo
        """Counts answered requests against their adapters' latency targets (None: not)."""

    async def generate(
        self, body: _Body, shape: Shape, to_generate: ToGenerate[_Body], receive: Receive
    ) -> msgspec.Struct | SseAnswer:
        """Answer ``body`` whole or as an SSE stream's body (sent with ``SSE_HEADERS``); raises
        ``LorafleetError`` before streaming.

        ``receive`` is the request's ASGI channel, its body read: a client that hangs up
        while its request waits (for a load, an instance, the first token or the whole
        answer) cancels it and gets ``ClientGoneError``, counted as 499.
        """
        exchange = Exchange(self.metrics, shape, current_record(), self.slo)
        exchange.record.model = body.model  # the name asked for, served or not
        try:
            return await _unless_client_gone(self._answer(body, to_generate, exchange), receive)
        except ClientGoneError as exc:
            exchange.failed(exc)
            raise

    async def _answer(
        self, body: _Body, to_generate: ToGenerate[_Body], exchange: Exchange
    ) -> msgspec.Struct | SseAnswer:
        served, request, answer = await self._prepare(body, to_generate, exchange)
        exchange.begin(answer)
        if not body.stream:
            return await self._whole(served, request, answer, exchange)
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        tokens = await self._open_stream(served, request, exchange)
        return SseAnswer(exchange, tokens, answer, include_usage=include_usage)

    async def _prepare(
        self, body: _Body, to_generate: ToGenerate[_Body], exchange: Exchange
    ) -> tuple[ServedModel, GenerateRequest, Answer]:
        """Resolve the model and build the request; failures are counted, then raised."""
        try:
            body = self._to_version(body, exchange)
            served = await self.resolver.resolve(body.model)
            exchange.label = served.name
            # vLLM's answer id: the endpoint's prefix and the request id (x-request-id).
            answer_id = exchange.shape.id_prefix + exchange.record.request_id
            request = to_generate(body, served, answer_id)
        except LorafleetError as exc:
            exchange.failed(exc)
            raise
        logprobs = request.sampling.logprobs is not None
        answer = Answer(
            id=answer_id, created=int(time.time()), model=served.name, logprobs=logprobs
        )
        return served, request, answer

    def _to_version(self, body: _Body, exchange: Exchange) -> _Body:
        """``body`` for the version of an alias it names (tracked in ``exchange``), else as is."""
        if self.rollouts is None:
            return body
        exchange.alias = self.rollouts.pick(body.model, exchange.record.session or body.user or "")
        if exchange.alias is None:
            return body
        return msgspec.structs.replace(body, model=exchange.alias.version)

    async def _whole(
        self, served: ServedModel, request: GenerateRequest, answer: Answer, exchange: Exchange
    ) -> msgspec.Struct:
        """The whole answer, its failures counted."""
        try:
            completion = await self._dispatch(self.dispatcher.complete, served, request)
        except LorafleetError as exc:
            exchange.failed(exc)
            raise
        finally:
            exchange.end()
        return exchange.whole(answer, completion)

    async def _open_stream(
        self, served: ServedModel, request: GenerateRequest, exchange: Exchange
    ) -> TokenStream:
        """The token stream, once its first chunk came; a failure until then is counted."""
        try:
            stream = functools.partial(self.dispatcher.stream, lookup=self.resolver.registry.get)
            tokens = await self._dispatch(stream, served, request)
        except BaseException as exc:
            exchange.end()
            if isinstance(exc, LorafleetError):
                exchange.failed(exc)
            raise
        if isinstance(tokens.first, TokenChunk):
            exchange.first_token()
        return tokens

    async def _dispatch(
        self,
        call: Callable[[ServedModel, GenerateRequest], Awaitable[_Answer]],
        served: ServedModel,
        request: GenerateRequest,
    ) -> _Answer:
        """``call`` the dispatcher; again after loading an adapter that went cold (evicted, or
        its instance died), up to ``COLD_RELOADS`` times."""
        for reloads in range(COLD_RELOADS):
            try:
                return await call(served, request)
            except (WorkerError, NoLiveInstanceError) as exc:
                spec = await self.resolver.gone_cold(served, exc)
                if spec is None:
                    raise
            log.info("adapter left its instances; loading it again", adapter=served.name,
                     reloads=reloads + 1)  # fmt: skip
            served = await self.resolver.loader.load(spec)
        return await call(served, request)


async def _until_disconnected(receive: Receive) -> None:
    """Return when the client hangs up: once the body is read, the next ASGI message
    on the request's channel is ``http.disconnect``."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_client_gone(work: Coroutine[Any, Any, _Answer], receive: Receive) -> _Answer:
    """Await ``work``; cancel it (and so its request at the worker) and raise
    ``ClientGoneError`` if the client hangs up first. Without this a dropped client's
    answer is generated to the end. The connection is watched from ``WATCH_AFTER_S`` on:
    most answers come sooner, and they then cost a timer instead of a watching task."""
    handler = asyncio.current_task()
    assert handler is not None  # called from a request handler's task
    loop = asyncio.get_running_loop()
    hung_up = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal hung_up
        await _until_disconnected(receive)
        hung_up = True
        handler.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(WATCH_AFTER_S, start_watching)
    try:
        return await work
    except asyncio.CancelledError:
        if not hung_up:
            raise
        handler.uncancel()
        record = current_record()
        when = f"before the answer from {record.model!r} was complete; it was cancelled"
        raise ClientGoneError(record.request_id, when) from None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
