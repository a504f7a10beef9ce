"""A test-only stand-in worker: real NATS subject, real etcd records, scripted behaviour.

It serves the request plane like a worker (``TokenChunk``s then a ``FinalChunk``)
but can also stay mute, fail, or go slowly, so the frontend's failure paths
can be driven exactly. Its base card says LoRA management is on unless
``enable_lora=False``. With ``answer_loads`` it serves ``update/load_lora`` by
publishing the adapter's card; otherwise it never answers updates, only records
them. The real
worker (``python -m worker``) is used by the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import time

import nats
from nats.aio.msg import Msg

from discovery.client import EtcdClient
from discovery.keys import base_card_key, instance_key, lora_card_key, nats_subject
from discovery.lease import LeaseKeeper
from proto.discovery import (
    Instance,
    LoraInfo,
    ModelDeploymentCard,
    RuntimeConfig,
    encode_record,
)
from proto.errors import ErrorInfo
from proto.inference import (
    CancelRequest,
    ErrorChunk,
    FinalChunk,
    GenerateRequest,
    PingRequest,
    TokenChunk,
    UpdateReply,
    UpdateRequest,
    Usage,
    decode_instance_message,
    encode_msg,
)
from proto.naming import lora_id, lora_slug

COMPONENT = "backend"
ENDPOINT = "generate"


class Behaviour(enum.Enum):
    """What the stand-in does with a generate request."""

    ANSWER = "answer"
    MUTE = "mute"  # answers nothing at all, not even pings: a wedged or vanished worker
    FAIL = "fail"  # answers every request with an ErrorChunk


class StandInWorker:
    """Answers ``tok0 tok1 ...`` honouring max_tokens; usage counts whitespace words."""

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
        enable_lora: bool = True,
    ) -> None:
        self.nats_url = nats_url
        self.etcd = etcd
        self.namespace = namespace
        self.model = model
        self.adapters = adapters
        self.behaviour = behaviour
        self.token_delay_s = token_delay_s
        self.error = error or ErrorInfo(code="internal_error", message="engine exploded")
        self.context_length = context_length
        self.answer_loads = answer_loads
        self.enable_lora = enable_lora
        self.loads: list[str] = []
        self.updates: list[str] = []
        self.generated: list[GenerateRequest] = []
        self.cancelled: list[str] = []
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> StandInWorker:
        self.lease = await LeaseKeeper.grant(self.etcd, ttl_s=10)
        self.instance_id = self.lease.lease_id
        self.subject = nats_subject(self.namespace, COMPONENT, ENDPOINT, self.instance_id)
        self.nc = await nats.connect(self.nats_url)
        self.sub = await self.nc.subscribe(self.subject, cb=self._on_message)
        await self.nc.flush()
        await self.nc.flush()
        ids = (self.namespace, COMPONENT, ENDPOINT, self.instance_id)
        instance = Instance(
            namespace=self.namespace, component=COMPONENT, endpoint=ENDPOINT,
            instance_id=self.instance_id, subject=self.subject, engine="stand-in",
            pid=os.getpid(), started_at=time.time(),
        )  # fmt: skip
        await self.lease.put(instance_key(*ids), encode_record(instance))
        await self.lease.put(base_card_key(*ids), encode_record(self.base_card()))
        for name in self.adapters:
            await self.lease.put(
                lora_card_key(*ids, lora_slug(name)), encode_record(self.card(name))
            )
        return self

    def base_card(self) -> ModelDeploymentCard:
        return ModelDeploymentCard(
            display_name=self.model, slug=lora_slug(self.model),
            source_path=f"/models/{self.model}", context_length=self.context_length,
            runtime_config=RuntimeConfig(enable_lora=self.enable_lora),
        )  # fmt: skip

    def card(self, adapter: str) -> ModelDeploymentCard:
        lora = LoraInfo(name=adapter, lora_id=lora_id(adapter), base_model=self.model,
                        uri=f"file:///adapters/{adapter}")  # fmt: skip
        return ModelDeploymentCard(
            display_name=adapter, slug=lora_slug(adapter), lora=lora,
            context_length=self.context_length,
        )  # fmt: skip

    async def stop(self, *, retract: bool = True) -> None:
        """Stop answering; with ``retract`` also delete the records (else they stay till TTL)."""
        for task in self._tasks.values():
            task.cancel()
        with contextlib.suppress(Exception):
            await self.nc.close()
        await self.lease.aclose(revoke=retract)

    async def _on_message(self, msg: Msg) -> None:
        if self.behaviour is Behaviour.MUTE:
            return
        message = decode_instance_message(msg.data)
        if isinstance(message, PingRequest):
            await self.nc.publish(msg.reply, encode_msg(UpdateReply(body={"status": "ok"})))
        elif isinstance(message, CancelRequest):
            self.cancelled.append(message.request_id)
            task = self._tasks.pop(message.request_id, None)
            if task is not None:
                task.cancel()
        elif isinstance(message, UpdateRequest):
            self.updates.append(message.name)
            if self.answer_loads:
                await self._load(message.body["lora_name"], msg.reply)
        elif isinstance(message, GenerateRequest):
            self.generated.append(message)
            task = asyncio.create_task(self._generate(message, msg.reply))
            self._tasks[message.request_id] = task
            task.add_done_callback(lambda _: self._tasks.pop(message.request_id, None))

    async def _load(self, name: str, reply: str) -> None:
        """Publish ``name``'s card, then answer success, as the real lifecycle does."""
        self.loads.append(name)
        ids = (self.namespace, COMPONENT, ENDPOINT, self.instance_id)
        await self.lease.put(lora_card_key(*ids, lora_slug(name)), encode_record(self.card(name)))
        body = {"status": "success", "lora_name": name, "lora_id": lora_id(name)}
        await self.nc.publish(reply, encode_msg(UpdateReply(body=body)))

    async def _generate(self, request: GenerateRequest, reply: str) -> None:
        if self.behaviour is Behaviour.FAIL:
            await self.nc.publish(reply, encode_msg(ErrorChunk(error=self.error)))
            return
        count = request.sampling.max_tokens
        for index in range(count):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            text = f"tok{index}" if index == 0 else f" tok{index}"
            await self.nc.publish(reply, encode_msg(TokenChunk(text=text)))
        prompt = request.prompt or " ".join(m.content for m in request.messages or [])
        usage = Usage(prompt_tokens=len(prompt.split()), completion_tokens=count)
        await self.nc.publish(reply, encode_msg(FinalChunk(finish_reason="length", usage=usage)))
