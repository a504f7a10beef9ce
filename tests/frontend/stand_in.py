"""A test-only stand-in worker: the real endpoint and engine registry, a scripted engine.

It serves its subject with ``worker.endpoint.Endpoint`` and answers updates
through ``worker.engine_registry.EngineRegistry``, as ``python -m lorafleet.worker`` does,
so it cannot drift from the worker protocol; only the engine is scripted: it
answers ``tok0 tok1 ...``, fails, or goes slowly, so the frontend's failure
paths can be driven exactly. ``Behaviour.MUTE`` swaps the endpoint for a
subscriber that answers nothing at all (and records the generate requests it got) until
``unmute()``: a worker behind a stalled NATS route, then the route heals. Its base card
says LoRA management is on unless ``enable_lora=False``; with ``gathers=False`` it streams
whole answers token by token, as workers from before ``GenerateRequest.whole`` do. With
``final_on_ping`` the engine holds each answer's final chunk until the frontend pings
about that request, and the endpoint answers that ping only once the request has
ended: the 404 pong of a slow engine whose final chunk crossed the frontend's ping,
made exact. With ``answer_loads`` it serves
``update/load_lora`` by publishing the adapter's card (``lose_first_card``: not
the first time, as if evicted before anyone saw it; ``only_placed_copies``: after
429 ``capacity`` to a load that keeps placed copies); otherwise it never
answers updates, only records them. With ``kv=True`` it caches the prompts it serves and
publishes KV events as a worker's relay does (``kv_stand_in.py``, a stand-in for the
mocker's relay); ``digests`` give its adapters' versions. The real worker is used by the
end-to-end tests.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import instance_key
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.discovery.nats_connection import flush_subscriptions
from lorafleet.proto.adapters import LoadLoraRequest, LoraResponse
from lorafleet.proto.discovery import Instance, LoraInfo, ModelDeploymentCard, encode_record
from lorafleet.proto.errors import CapacityError, ErrorInfo, UnavailableError, error_from_info
from lorafleet.proto.inference import (
    FinalChunk,
    GenerateRequest,
    PingRequest,
    TokenChunk,
    UpdateReply,
    Usage,
    decode_instance_message,
)
from lorafleet.proto.naming import lora_id, lora_slug
from lorafleet.worker.endpoint import Endpoint, EndpointAddress
from lorafleet.worker.engine import EngineConfig, EngineRoute, LLMEngine, ModelEndpoint
from lorafleet.worker.engine_registry import EngineRegistry, error_reply
from tests.frontend.kv_stand_in import SPEC, KvEndpoint, StandInKv

COMPONENT = "backend"
ENDPOINT = "generate"


class Behaviour(enum.Enum):
    """What the stand-in does with a generate request."""

    ANSWER = "answer"
    MUTE = "mute"  # answers nothing at all, not even pings: a wedged or vanished worker
    FAIL = "fail"  # answers every request with an ErrorChunk


class ScriptedEngine(LLMEngine):
    """Answers ``tok0 tok1 ...`` honouring max_tokens (or fails); records what it was asked."""

    def __init__(
        self, config: EngineConfig, *, error: ErrorInfo | None, token_delay_s: float
    ) -> None:
        super().__init__(config)
        self.error = error
        self.token_delay_s = token_delay_s
        self.generated: list[GenerateRequest] = []
        self.cancelled: list[str] = []
        self.loads: list[str] = []
        self.lose_first_card = False
        self.only_placed_copies = False
        self.load_asks: list[bool] = []
        """``evict_placed`` of every load asked for, refused ones included."""
        self.final_on_ping = False
        self.pinged: collections.defaultdict[str, asyncio.Event] = collections.defaultdict(
            asyncio.Event
        )
        """Per request id: the frontend pinged this instance about it."""
        self._endpoint: ModelEndpoint | None = None
        self.digests: dict[str, str] = {}
        """Adapter name -> the digest its card says (none: no digest)."""
        self.kv: StandInKv | None = None

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | FinalChunk]:
        self.generated.append(request)
        if self.kv is not None:
            await self.kv.serve(request)
        if self.error is not None:
            raise error_from_info(self.error)
        count = request.sampling.max_tokens
        try:
            for index in range(count):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                yield TokenChunk(text=f"tok{index}" if index == 0 else f" tok{index}")
        except asyncio.CancelledError:
            self.cancelled.append(request.request_id)
            raise
        if self.final_on_ping:
            await self.pinged[request.request_id].wait()
        prompt = request.prompt or " ".join(m.content for m in request.messages or [])
        usage = Usage(prompt_tokens=len(prompt.split()), completion_tokens=count)
        yield FinalChunk(finish_reason="length", usage=usage)

    def card(self, adapter: str) -> ModelDeploymentCard:
        """The card of ``adapter`` on this engine's base model."""
        lora = LoraInfo(name=adapter, lora_id=lora_id(adapter), base_model=self.config.model_name,
                        uri=f"file:///adapters/{adapter}",
                        digest=self.digests.get(adapter, ""))  # fmt: skip
        return ModelDeploymentCard(
            display_name=adapter, slug=lora_slug(adapter), lora=lora,
            context_length=self.config.context_length,
        )  # fmt: skip

    def supported_updates(self) -> dict[str, EngineRoute[Any]]:
        return {"load_lora": EngineRoute(LoadLoraRequest, self._load)}

    async def on_endpoint_ready(self, endpoint: ModelEndpoint) -> None:
        self._endpoint = endpoint

    async def _load(self, request: LoadLoraRequest) -> LoraResponse:
        """Publish the adapter's card, then answer success, as the real lifecycle does."""
        assert self._endpoint is not None
        self.load_asks.append(request.evict_placed)
        if self.only_placed_copies and not request.evict_placed:
            raise CapacityError("every slot holds a placed copy", lora_name=request.lora_name)
        self.loads.append(request.lora_name)
        if not self.lose_first_card or len(self.loads) > 1:
            await self._endpoint.register_model(self.card(request.lora_name))
        name = request.lora_name
        return LoraResponse(status="success", lora_name=name, lora_id=lora_id(name))


class StandInWorker:
    """A worker process's NATS and etcd half, in this process, around a ``ScriptedEngine``."""

    def __init__(
        self,
        nats_url: str,
        etcd: EtcdClient,
        namespace: str,
        model: str,
        *,
        adapters: tuple[str, ...] = (),
        behaviour: Behaviour = Behaviour.ANSWER,
        token_delay_s: float = 0.0,
        error: ErrorInfo | None = None,
        context_length: int = 2048,
        answer_loads: bool = False,
        lose_first_card: bool = False,
        only_placed_copies: bool = False,
        enable_lora: bool = True,
        gathers: bool = True,
        final_on_ping: bool = False,
        kv: bool = False,
        digests: dict[str, str] | None = None,
    ) -> None:
        self.nats_url = nats_url
        self.etcd = etcd
        self.namespace = namespace
        self.adapters = adapters
        self.behaviour = behaviour
        self.answer_loads = answer_loads
        self.gathers = gathers
        if behaviour is Behaviour.FAIL:
            error = error or ErrorInfo(code="internal_error", message="engine exploded")
        config = EngineConfig(model=f"/models/{model}", served_model_name=model,
                              enable_lora=enable_lora, context_length=context_length)  # fmt: skip
        self.engine = ScriptedEngine(config, error=error, token_delay_s=token_delay_s)
        self.engine.lose_first_card = lose_first_card
        self.engine.only_placed_copies = only_placed_copies
        self.engine.final_on_ping = final_on_ping
        self.engine.digests.update(digests or {})
        self.with_kv = kv
        self.registry = EngineRegistry()
        self.updates: list[str] = []
        self.unanswered: list[GenerateRequest] = []
        """The generate requests a MUTE stand-in received (and ignored)."""
        self._mute: Subscription | None = None
        self._stopped = asyncio.Event()

    @property
    def generated(self) -> list[GenerateRequest]:
        """Every generate request the engine was handed."""
        return self.engine.generated

    @property
    def cancelled(self) -> list[str]:
        """Request ids whose generation was cancelled."""
        return self.engine.cancelled

    @property
    def loads(self) -> list[str]:
        """Adapter names loaded through ``update/load_lora``."""
        return self.engine.loads

    async def start(self) -> StandInWorker:
        """Grant the lease, serve the subject and publish the instance and cards."""
        self.lease = await LeaseKeeper.grant(self.etcd, ttl_s=10)
        self.instance_id = self.lease.lease_id
        address = EndpointAddress(namespace=self.namespace, component=COMPONENT,
                                  endpoint=ENDPOINT, instance_id=self.instance_id)  # fmt: skip
        self.subject = address.subject
        self.nc = await nats.connect(self.nats_url)
        if self.with_kv:
            self.kv = StandInKv(self.nc, self.namespace, self.instance_id, self.engine.digests)
            self.engine.kv = self.kv
            self.endpoint = KvEndpoint(self.nc, self.lease, address)
            self.endpoint.kv = self.kv
        elif self.engine.final_on_ping:
            self.endpoint = _LatePongEndpoint(self.nc, self.lease, address)
        else:
            endpoint = Endpoint if self.gathers else _StreamingEndpoint
            self.endpoint = endpoint(self.nc, self.lease, address)
        if self.behaviour is Behaviour.MUTE:
            self._mute = await self.nc.subscribe(self.subject, cb=self._ignore)
            await flush_subscriptions(self.nc)
        else:
            await self._serve()
        await self.lease.put(instance_key(self.namespace, COMPONENT, ENDPOINT, self.instance_id),
                             encode_record(self._instance()))  # fmt: skip
        await self.endpoint.register_model(self.engine.base_card())
        for name in self.adapters:
            await self.endpoint.register_model(self.engine.card(name))
        return self

    def card(self, adapter: str) -> ModelDeploymentCard:
        """The card of ``adapter`` on this worker's base model."""
        return self.engine.card(adapter)

    async def swap(self, adapter: str, digest: str) -> None:
        """Serve another version of ``adapter``: its new card, then the old blocks go."""
        assert self.kv is not None, "only a kv stand-in swaps versions"
        old = self.kv.version(adapter)
        self.engine.digests[adapter] = digest
        await self.endpoint.register_model(self.engine.card(adapter))
        await self.kv.clear(old)

    async def unmute(self) -> None:
        """A MUTE stand-in starts answering everything, pings included."""
        assert self._mute is not None, "only a MUTE stand-in can be unmuted"
        await self._mute.unsubscribe()
        self._mute = None
        self.behaviour = Behaviour.ANSWER
        await self._serve()
        await self.nc.flush()

    async def _ignore(self, msg: Msg) -> None:
        """A MUTE stand-in's subscriber: it takes every message and answers none."""
        message = decode_instance_message(msg.data)
        if isinstance(message, GenerateRequest):
            self.unanswered.append(message)

    async def stop(self, *, retract: bool = True) -> None:
        """Stop answering; with ``retract`` also delete the records (else they stay till TTL)."""
        self._stopped.set()
        await self.endpoint.stop_accepting()
        await self.endpoint.drain(0)
        await self.cut_from_nats()
        await self.lease.aclose(revoke=retract)

    async def cut_from_nats(self) -> None:
        """Close the NATS connection and wait until the server has dropped its subscription.

        The server learns of a closed connection a moment later; a request published in
        that moment would still be delivered to it and stall instead of finding no
        responder. Waiting here makes "no responder on its subject" certain, not a race
        that a busy machine loses.
        """
        with contextlib.suppress(Exception):
            await self.nc.close()
        probe = await nats.connect(self.nats_url)
        try:
            async with asyncio.timeout(30):  # a subscription that never goes fails, not hangs
                while True:
                    try:
                        await probe.request(self.subject, b"", timeout=1)
                    except NoRespondersError:
                        return
                    except TimeoutError:  # delivered to the closing connection: ask again
                        continue
        finally:
            await probe.close()

    async def _serve(self) -> None:
        """The start-up steps of ``worker.runtime`` that matter on the wire, in its order."""
        await self.endpoint.serve()
        self.endpoint.engine = self.engine
        await self.engine.on_endpoint_ready(self.endpoint)
        self.registry.register(self.engine)
        self.endpoint.update_handler = self._on_update

    async def _on_update(self, name: str, body: dict[str, Any]) -> UpdateReply:
        self.updates.append(name)
        if not self.answer_loads:
            await self._stopped.wait()  # never answers while it runs
            return error_reply(UnavailableError("stand-in stopped"))
        return await self.registry.call(name, body)

    def _instance(self) -> Instance:
        return Instance(
            namespace=self.namespace, component=COMPONENT, endpoint=ENDPOINT,
            instance_id=self.instance_id, subject=self.subject, engine="stand-in",
            pid=os.getpid(), started_at=time.time(), kv_cache=SPEC if self.with_kv else None,
        )  # fmt: skip


class _StreamingEndpoint(Endpoint):
    """The endpoint of a worker from before ``GenerateRequest.whole``: it ignores the field
    and sends every answer token chunk by token chunk."""

    def _start_generate(self, request: GenerateRequest, reply: str) -> None:
        super()._start_generate(msgspec.structs.replace(request, whole=False), reply)


class _LatePongEndpoint(Endpoint):
    """An endpoint that answers a ping about a running request only after letting that
    request finish: its final chunk goes out first, then the pong says 404 (not running)."""

    async def _on_message(self, msg: Msg) -> None:
        message = decode_instance_message(msg.data)
        if isinstance(message, PingRequest) and (task := self._inflight.get(message.request_id)):
            assert isinstance(self.engine, ScriptedEngine)
            self.engine.pinged[message.request_id].set()
            await asyncio.wait({task})
            while message.request_id in self._inflight:  # its done callback forgets it
                await asyncio.sleep(0)
        await super()._on_message(msg)
