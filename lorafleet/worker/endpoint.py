"""The worker's NATS endpoint: serves its subject and publishes the engine's cards.

It decodes every message on the instance subject, streams generate requests
back to their reply inbox, cancels on request, answers pings, KV snapshot requests and
updates.
Updates need the worker's token (``DYN_SYSTEM_AUTH_TOKEN``, when set) in the
message's ``Authorization`` header, as the status server's routes do.
It is the ``ModelEndpoint`` handed to the engine in ``on_endpoint_ready``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import msgspec
import nats.aio.client
import nats.aio.msg
import structlog

from lorafleet.discovery.keys import base_card_key, lora_card_key, nats_subject
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.discovery.nats_connection import flush_subscriptions
from lorafleet.process.auth import AUTHORIZATION_HEADER, bearer_token_accepted
from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.discovery import ModelDeploymentCard, encode_record
from lorafleet.proto.errors import (
    ErrorInfo,
    InvalidRequestError,
    LorafleetError,
    UnauthorizedError,
    UnavailableError,
)
from lorafleet.proto.inference import (
    CancelRequest,
    ErrorChunk,
    FinalChunk,
    GenerateRequest,
    KvSnapshotRequest,
    PingRequest,
    TokenChunk,
    UpdateReply,
    UpdateRequest,
    decode_instance_message,
    encode_msg,
    join_tokens,
)
from lorafleet.proto.kv_events import KvSnapshot
from lorafleet.worker import metrics
from lorafleet.worker.engine import LLMEngine
from lorafleet.worker.engine_registry import UpdateBody, error_reply
from lorafleet.worker.kv_relay import KvRelay
from lorafleet.worker.request_timing import RequestTiming

__all__ = ["Endpoint", "EndpointAddress", "UpdateHandler"]

log = structlog.get_logger(__name__)

SUBSCRIPTION_CHECK_TIMEOUT_S: Final = 5.0
PENDING_MESSAGES_LIMIT: Final = 65536

UpdateHandler: TypeAlias = Callable[[str, UpdateBody], Awaitable[UpdateReply]]
"""Runs an engine update named by the NATS caller; answers as the status server would."""


@dataclass(frozen=True, kw_only=True)
class EndpointAddress:
    """Where an instance lives: namespace/component/endpoint and its instance id."""

    namespace: str
    component: str
    endpoint: str
    instance_id: int

    @property
    def subject(self) -> str:
        """The NATS subject of this instance."""
        return nats_subject(self.namespace, self.component, self.endpoint, self.instance_id)

    def card_key(self, card: ModelDeploymentCard) -> str:
        """The etcd key of ``card`` for this instance (base or adapter)."""
        parts = (self.namespace, self.component, self.endpoint, self.instance_id)
        return lora_card_key(*parts, card.slug) if card.lora else base_card_key(*parts)


class Endpoint:
    """Serves one instance subject for an engine and owns the engine's cards in etcd."""

    def __init__(
        self,
        nc: nats.aio.client.Client,
        lease: LeaseKeeper,
        address: EndpointAddress,
        *,
        update_token: str | None = None,
    ) -> None:
        self._nc = nc
        self._lease = lease
        self.address = address
        self._update_token = update_token
        self.engine: LLMEngine | None = None
        self.update_handler: UpdateHandler | None = None
        self.kv_relay: KvRelay | None = None
        """The engine's block events' relay, which answers snapshot requests (None: the
        engine reports no KV cache; the answer is then empty)."""
        self._subscription: Any = None
        self._inflight: dict[str, asyncio.Task[None]] = {}
        """The generate requests this instance is serving, by request id, from arrival until
        the answer is sent: cancel and ping find them, drain waits for them, and their number
        is the worker's one in-flight count (``inflight``: the load record, the gauge). Not
        per adapter version (``AdapterVersion.busy``) nor vLLM's ids (``AdapterTable``)."""
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def instance_id(self) -> int:
        """The lease id that names this instance."""
        return self.address.instance_id

    @property
    def inflight(self) -> int:
        """Generate requests this worker is serving now, base model and adapters."""
        return len(self._inflight)

    async def register_model(self, card: ModelDeploymentCard) -> None:
        """Publish ``card`` under the lease (raises ``EtcdUnavailableError``)."""
        await self._lease.put(self.address.card_key(card), encode_record(card))

    async def unregister_model(self, card: ModelDeploymentCard) -> None:
        """Retract ``card`` (raises ``EtcdUnavailableError``; the card then stays owned)."""
        await self._lease.delete(self.address.card_key(card))

    async def serve(self) -> None:
        """Subscribe the instance subject and prove the server routes it to us."""
        self._subscription = await self._nc.subscribe(
            self.address.subject, cb=self._on_message, pending_msgs_limit=PENDING_MESSAGES_LIMIT
        )
        await flush_subscriptions(self._nc)
        reply = await self._nc.request(
            self.address.subject, encode_msg(PingRequest()), timeout=SUBSCRIPTION_CHECK_TIMEOUT_S
        )
        msgspec.msgpack.decode(reply.data, type=UpdateReply)
        log.info("endpoint serving", subject=self.address.subject)

    async def stop_accepting(self) -> None:
        """Unsubscribe: new requests find no responder and go to other instances."""
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None

    async def drain(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for in-flight requests, then cancel the rest."""
        pending = list(self._inflight.values())
        if pending:
            log.info("finishing in-flight requests", count=len(pending), grace_s=grace_s)
            _, still_running = await asyncio.wait(pending, timeout=grace_s)
            await cancel_and_wait(*still_running)
        await self._nc.flush()

    async def _on_message(self, msg: nats.aio.msg.Msg) -> None:
        try:
            message = decode_instance_message(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            # RecursionError: msgpack nested deeper than the decoder's stack (a tool's mistake)
            error = InvalidRequestError(f"undecodable message on {msg.subject}: {exc}")
            if msg.reply:
                await self._nc.publish(msg.reply, encode_msg(ErrorChunk(error=error.to_info())))
            return
        match message:
            case GenerateRequest():
                self._start_generate(message, msg.reply)
            case CancelRequest(request_id=request_id):
                if task := self._inflight.get(request_id):
                    task.cancel()
            case PingRequest(request_id=request_id):
                await msg.respond(encode_msg(self._pong(request_id)))
            case KvSnapshotRequest():
                if msg.reply:
                    await msg.respond(encode_msg(await self._kv_snapshot()))
            case UpdateRequest():
                self._spawn(self._serve_update(message, msg))

    async def _kv_snapshot(self) -> KvSnapshot:
        """Every KV block this instance holds, as its events said (empty without a cache)."""
        if self.kv_relay is None:
            return KvSnapshot(instance_id=self.instance_id, seq=0)
        return await self.kv_relay.snapshot()

    def _pong(self, request_id: str) -> UpdateReply:
        """Alive; 404 when asked about a request this instance is not running."""
        if request_id and request_id not in self._inflight:
            return UpdateReply(status_code=404, body={"message": f"no request {request_id!r}"})
        return UpdateReply()

    def _start_generate(self, request: GenerateRequest, reply: str) -> None:
        if not reply:
            return
        task = asyncio.create_task(self._serve_generate(request, reply))
        self._inflight[request.request_id] = task
        task.add_done_callback(functools.partial(self._forget, request.request_id))

    def _forget(self, request_id: str, task: asyncio.Task[None]) -> None:
        """Drop a finished task from ``_inflight``, unless a newer one took its request id
        (a client may reuse an ``x-request-id``)."""
        if self._inflight.get(request_id) is task:
            del self._inflight[request_id]

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_generate(self, request: GenerateRequest, reply: str) -> None:
        # This task's own context: every log line about the request carries its id.
        structlog.contextvars.bind_contextvars(request_id=request.request_id, model=request.model)
        started = time.perf_counter()
        outcome = "ok"
        try:
            await self._stream(request, reply)
        except asyncio.CancelledError:
            outcome = "cancelled"
        except LorafleetError as exc:
            outcome = exc.code
            await self._nc.publish(reply, encode_msg(ErrorChunk(error=exc.to_info())))
        except Exception as exc:
            outcome = "engine_error"
            log.exception("engine failed", request_id=request.request_id, model=request.model)
            info = ErrorInfo(code="upstream_error", message=f"engine failed: {exc}")
            await self._nc.publish(reply, encode_msg(ErrorChunk(error=info)))
        finally:
            metrics.REQUESTS.labels(request.model, outcome).inc()
            metrics.REQUEST_SECONDS.labels(request.model).observe(time.perf_counter() - started)

    async def _stream(self, request: GenerateRequest, reply: str) -> None:
        if self.engine is None:
            raise UnavailableError("worker is starting; retry on another instance")
        timing = RequestTiming(self.engine.config.model_name, request.model)
        gathered: list[TokenChunk] | None = [] if request.whole else None
        with self.engine.track_request(request.model):
            async for chunk in self.engine.generate(request):
                if isinstance(chunk, TokenChunk):
                    if gathered is None:
                        await self._nc.publish(reply, encode_msg(chunk))
                    else:  # sent with the final chunk: one message for the whole answer
                        gathered.append(chunk)
                    metrics.GENERATED_TOKENS.labels(request.model).inc(chunk.tokens)
                    timing.token()
                elif isinstance(chunk, FinalChunk):
                    if gathered:
                        chunk = msgspec.structs.replace(
                            chunk, answer=join_tokens(gathered),
                            since_first_token_s=timing.since_first_token_s,
                        )  # fmt: skip
                    await self._nc.publish(reply, encode_msg(chunk))
                    timing.finished(chunk)
                    log.info(
                        "request served", finish_reason=chunk.finish_reason,
                        prompt_tokens=chunk.usage.prompt_tokens,
                        completion_tokens=chunk.usage.completion_tokens,
                        duration_s=round(timing.elapsed_s, 4),
                    )  # fmt: skip
                    return

    async def _serve_update(self, request: UpdateRequest, msg: nats.aio.msg.Msg) -> None:
        answer = await self._update_answer(request, msg)
        if msg.reply:
            await msg.respond(encode_msg(answer))

    async def _update_answer(self, request: UpdateRequest, msg: nats.aio.msg.Msg) -> UpdateReply:
        """Run the update if the message carries the token; refuse before touching anything."""
        authorization = (msg.headers or {}).get(AUTHORIZATION_HEADER)
        if not bearer_token_accepted(authorization, self._update_token):
            log.warning("update over NATS refused: missing or wrong token", update=request.name)
            return error_reply(UnauthorizedError(
                f"{request.name} over NATS needs the header 'Authorization: Bearer <token>' "
                "(the worker's DYN_SYSTEM_AUTH_TOKEN; a frontend sends its own "
                "DYN_SYSTEM_AUTH_TOKEN)"
            ))  # fmt: skip
        if self.update_handler is None:
            return error_reply(UnavailableError("worker is starting"))
        return await self.update_handler(request.name, request.payload)
