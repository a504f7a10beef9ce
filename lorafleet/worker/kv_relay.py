"""Publish this worker's KV block events to the fleet, and answer frontends' snapshot requests.

The engine hands each event to :meth:`KvRelay.add`, which never blocks generation; every
``BATCH_INTERVAL_S`` the events gathered go out as one ``KvEventBatch`` on the namespace's
events subject, ``seq`` counting batches from 1. A batch that cannot be sent (NATS down) or
that overflowed is lost but its ``seq`` is spent, so frontends see the gap and ask for a
snapshot; a malformed event is dropped and counted, never sent. Must not decide anything
about routing (``docs/routing.md``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

import nats.aio.client
import nats.errors
import structlog

from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.inference import encode_msg
from lorafleet.proto.kv_events import (
    BlocksRemoved,
    BlocksStored,
    KvEvent,
    KvEventBatch,
    KvSnapshot,
    VersionCleared,
)
from lorafleet.worker import metrics
from lorafleet.worker.kv_mirror import KvMirror

__all__ = ["KvRelay"]

log = structlog.get_logger(__name__)

BATCH_INTERVAL_S: Final = 0.25
"""Events gathered this long go out as one message. Each message costs every frontend a
Python callback and a decode, whatever it holds: at 50 ms four busy workers sent a frontend
more messages than it served requests, and its CPU on prompts that share nothing rose about
a tenth (``bench/README.md``). The lag delays only what other frontends sent and evictions:
a frontend's own sends count as held until their events come (``RecentSends``)."""
MAX_PENDING_HASHES: Final = 50_000
"""Block hashes waiting to be sent at most (about 450 kB of msgpack, under NATS's 1 MB
payload); past it the waiting events are dropped and their batch's ``seq`` skipped."""
_INT64: Final = range(-(2**63), 2**63)


class KvRelay:
    """Gathers one instance's block events, publishes them in batches, keeps what they said.

    Example::

        relay = KvRelay.start(nc, subject="ns.kv_events", instance_id=lease_id, model_name="demo")
        engine.publish_kv_events(relay.add)
        snapshot = await relay.snapshot()   # what a frontend that saw every batch holds
        await relay.aclose()
    """

    def __init__(
        self, nc: nats.aio.client.Client, *, subject: str, instance_id: int, model_name: str
    ) -> None:
        self._nc = nc
        self._subject = subject
        self._instance_id = instance_id
        self._model_name = model_name
        self._mirror = KvMirror()
        self._pending: list[KvEvent] = []
        self._pending_hashes = 0
        self._seq = 0
        self._ready = asyncio.Event()
        self._reported: set[str] = set()
        """Drop reasons already logged (each is logged once; all are counted)."""
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def start(
        cls, nc: nats.aio.client.Client, *, subject: str, instance_id: int, model_name: str
    ) -> KvRelay:
        """Start publishing; the first batch says the engine starts with an empty cache."""
        relay = cls(nc, subject=subject, instance_id=instance_id, model_name=model_name)
        relay.add(VersionCleared(version=""))
        relay._task = asyncio.create_task(relay._publish_loop(), name="kv-relay")
        return relay

    def add(self, event: KvEvent) -> None:
        """Queue ``event`` for the next batch; a malformed one is dropped and counted."""
        if not _well_formed(event):
            self._drop("malformed", 1, kv_event=repr(event)[:200])
            return
        size = len(event.hashes) if isinstance(event, BlocksStored | BlocksRemoved) else 1
        if self._pending_hashes + size > MAX_PENDING_HASHES:
            self._drop("overflow", len(self._pending))
            self._pending, self._pending_hashes = [], 0
            self._seq += 1  # the lost batch's number: frontends see the gap
        self._mirror.apply(event)
        self._pending.append(event)
        self._pending_hashes += size
        self._ready.set()

    async def snapshot(self) -> KvSnapshot:
        """Every block held now, as of the batch that carries every event so far (sent
        first, so no frontend applies an event the snapshot already holds out of order)."""
        batch = self._take_batch()
        snapshot = KvSnapshot(
            instance_id=self._instance_id, seq=self._seq, blocks=self._mirror.blocks()
        )
        if batch is not None:
            await self._publish(batch)
        return snapshot

    async def aclose(self) -> None:
        """Stop publishing (the lease's end tells frontends the blocks are gone)."""
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _publish_loop(self) -> None:
        while True:
            await self._ready.wait()
            await asyncio.sleep(BATCH_INTERVAL_S)
            batch = self._take_batch()
            if batch is not None:
                await self._publish(batch)

    def _take_batch(self) -> KvEventBatch | None:
        """The waiting events as the next batch (None if none wait)."""
        self._ready.clear()
        if not self._pending:
            return None
        self._seq += 1
        batch = KvEventBatch(
            instance_id=self._instance_id, seq=self._seq, sent_at=time.time(), events=self._pending
        )
        self._pending, self._pending_hashes = [], 0
        metrics.observe_kv_blocks(self._model_name, self._mirror.counts())
        return batch

    async def _publish(self, batch: KvEventBatch) -> None:
        try:
            await self._nc.publish(self._subject, encode_msg(batch))
        except nats.errors.Error as exc:
            self._drop("publish_failed", len(batch.events), seq=batch.seq, error=str(exc))

    def _drop(self, reason: str, count: int, **context: object) -> None:
        """Count events not sent; log the first time for each reason."""
        metrics.KV_EVENTS_DROPPED.labels(reason).inc(count)
        if reason not in self._reported:
            self._reported.add(reason)
            log.warning("KV events not published (logged once per reason)", reason=reason,
                        subject=self._subject, **context)  # fmt: skip


def _well_formed(event: object) -> bool:
    """Whether ``event`` is a block event whose fields have their declared types (msgspec
    checks none at construction, and one bad value would make a whole batch undecodable)."""
    match event:
        case (
            BlocksStored(version=str(), hashes=list(hashes))
            | BlocksRemoved(version=str(), hashes=list(hashes))
        ):
            return all(type(h) is int and h in _INT64 for h in hashes)
        case VersionCleared(version=str()):
            return True
    return False
