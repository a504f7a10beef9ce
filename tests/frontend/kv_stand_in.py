"""A stand-in for a worker's KV relay, for the stand-in worker (``stand_in.py``).

The stand-in's engine is scripted, so its cache is too: written before the mocker's paged
cache and ``worker/kv_relay.py`` were on main, and kept because a test can then lose a
batch or hold a prefix exactly. A stand-in worker made with ``kv=True`` caches what it
serves here: every whole block of each request's prompt (the mocker's word tokens, chained
per version and cache salt with ``fleet.kv_blocks``, as the real relay does). It counts its
prefix hits and queries in tokens (the worker's own evidence of where prefixes landed),
publishes ``KvEventBatch`` messages on the namespace's real events subject, and answers
``KvSnapshotRequest`` on its instance subject. Tests may also drop a batch on the floor
(``lose_next``) to make a gap, or hold snapshot answers back (``snapshots_held``) to keep
a frontend catching up.
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from lorafleet.discovery.keys import kv_events_subject
from lorafleet.fleet.kv_blocks import block_hashes, version_key, words_tokens
from lorafleet.proto.inference import (
    GenerateRequest,
    KvSnapshotRequest,
    decode_instance_message,
    encode_msg,
)
from lorafleet.proto.kv_events import (
    BlocksStored,
    KvCacheSpec,
    KvEvent,
    KvEventBatch,
    KvSnapshot,
    VersionCleared,
)
from lorafleet.worker.endpoint import Endpoint

BLOCK_SIZE = 16
SPEC = KvCacheSpec(block_size=BLOCK_SIZE, num_blocks=4096, events=True, tokenizer="words")


class StandInKv:
    """One stand-in worker's prefix cache: blocks by version, counters, events, snapshots."""

    def __init__(
        self, nc: NatsClient, namespace: str, instance_id: int, digests: dict[str, str]
    ) -> None:
        self.nc = nc
        self.subject = kv_events_subject(namespace)
        self.instance_id = instance_id
        self.digests = digests
        """Adapter name -> the digest of the version this worker holds (its cards say it)."""
        self.blocks: dict[str, list[int]] = {}
        self.hits = 0
        self.queries = 0
        self.seq = 0
        self.lose_next = False
        self.snapshots_asked = 0
        self.snapshots_answered = 0
        self.snapshots_held: asyncio.Event | None = None
        """While this is an event not yet set, snapshots are answered only once it is."""
        self._answers: set[asyncio.Task[None]] = set()

    def version(self, model: str) -> str:
        """The version key of ``model`` as this worker holds it."""
        return version_key(model, self.digests.get(model, ""))

    async def serve(self, request: GenerateRequest) -> None:
        """Count the request's cached prefix and cache the rest of its whole blocks."""
        texts = [request.prompt or ""] if request.messages is None else [
            m.content for m in request.messages
        ]  # fmt: skip
        tokens = words_tokens(texts)
        version = self.version(request.model)
        hashes = block_hashes(tokens, BLOCK_SIZE, version, request.cache_salt)
        held = self.blocks.setdefault(version, [])
        cached = 0
        while cached < len(hashes) and hashes[cached] in held:
            cached += 1
        self.queries += len(tokens)
        self.hits += cached * BLOCK_SIZE
        new = [h for h in hashes if h not in held]
        held.extend(new)
        if new:
            await self.publish([BlocksStored(version=version, hashes=new)])

    async def clear(self, version: str) -> None:
        """Every block of ``version`` goes (it was swapped out or unloaded)."""
        self.blocks.pop(version, None)
        await self.publish([VersionCleared(version=version)])

    async def publish(self, events: list[KvEvent]) -> None:
        """Send the next batch (or, with ``lose_next``, count it and send nothing)."""
        self.seq += 1
        if self.lose_next:
            self.lose_next = False
            return
        batch = KvEventBatch(instance_id=self.instance_id, seq=self.seq, sent_at=time.time(),
                             events=events)  # fmt: skip
        await self.nc.publish(self.subject, encode_msg(batch))
        await self.nc.flush()

    def snapshot(self) -> KvSnapshot:
        """Every block held now, as of the last batch."""
        blocks = {version: list(hashes) for version, hashes in self.blocks.items()}
        return KvSnapshot(instance_id=self.instance_id, seq=self.seq, blocks=blocks)

    def answer_snapshot(self, msg: Msg) -> None:
        """Answer ``msg`` with a snapshot, once ``snapshots_held`` (if any) is set.

        The answer waits in a task of its own: the endpoint's other messages (the requests a
        test sends meanwhile) go on being served."""
        self.snapshots_asked += 1
        task = asyncio.create_task(self._answer_when_released(msg))
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)

    async def _answer_when_released(self, msg: Msg) -> None:
        if self.snapshots_held is not None:
            await self.snapshots_held.wait()
        self.snapshots_answered += 1
        await msg.respond(encode_msg(self.snapshot()))


class KvEndpoint(Endpoint):
    """The real endpoint, plus the relay's answer to ``KvSnapshotRequest``."""

    kv: StandInKv

    async def _on_message(self, msg: Msg) -> None:
        try:
            message = decode_instance_message(msg.data)
        except Exception:  # the endpoint answers what does not decode
            message = None
        if msg.reply and isinstance(message, KvSnapshotRequest):
            self.kv.answer_snapshot(msg)
            return
        await super()._on_message(msg)
