"""Follow the workers' KV events into this frontend's prefix index, and catch up by snapshot.

Every frontend subscribes to the namespace's events subject and applies each instance's
batches in ``seq`` order. It follows an instance (the router trusts the index for it) only
while it has seen every batch since a snapshot or since the instance's first batch: a gap in
``seq``, a ``seq`` that goes back (the worker restarted), this frontend's start, and every
NATS reconnect stop following and ask the instance for a ``KvSnapshot``; meanwhile the router
routes that instance approximately. Batches that come while a snapshot is on its way wait
for it. An event for an instance or version etcd does not list is dropped and counted; a
malformed message is counted and skipped. An instance whose record leaves etcd leaves the
index at once, and so does an instance's version whose card goes (``FleetView``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Final

import msgspec
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from lorafleet.discovery.keys import kv_events_subject
from lorafleet.discovery.nats_connection import NatsConnection, NatsState
from lorafleet.frontend.kv.fleet_view import FleetView
from lorafleet.frontend.kv.prefix_index import PrefixIndex
from lorafleet.frontend.kv.prefix_memory import PrefixMemory
from lorafleet.frontend.kv.routing_metrics import RoutingMetrics
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.frontend.request_plane import RequestPlane, is_no_responders
from lorafleet.process.backoff import backoff_s
from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.inference import KvSnapshotRequest
from lorafleet.proto.kv_events import (
    KvEvent,
    KvEventBatch,
    KvSnapshot,
    VersionCleared,
    decode_kv_batch,
    decode_kv_snapshot,
)

__all__ = ["KvEventsListener"]

log = structlog.get_logger(__name__)

SNAPSHOT_TIMEOUT_S: Final = 2.0
"""How long a snapshot's answer may take before the instance is asked again later."""
SNAPSHOT_RETRY_CAP_S: Final = 5.0
WAITING_BATCHES: Final = 256
"""Batches kept per instance while its snapshot is on its way; past it they are dropped and
the snapshot asked again (its answer covers them)."""


@dataclass(slots=True)
class _Follow:
    """How far this frontend has applied one instance's batches."""

    seq: int = 0
    following: bool = False
    waiting: list[KvEventBatch] = field(default_factory=list)
    failures: int = 0


class KvEventsListener:
    """Keeps a ``PrefixIndex`` equal to what the instances hold, as far as events say."""

    def __init__(
        self,
        connection: NatsConnection,
        plane: RequestPlane,
        registry: ModelRegistry,
        index: PrefixIndex,
        memory: PrefixMemory,
        metrics: RoutingMetrics,
    ) -> None:
        self.connection = connection
        self.plane = plane
        self.index = index
        self.memory = memory
        self.metrics = metrics
        self.fleet = FleetView(registry.instance_cache, registry.card_cache,
                               instance_gone=self._instance_gone,
                               version_gone=index.remove_version)  # fmt: skip
        self._follows: dict[int, _Follow] = {}
        self._asked: asyncio.Queue[int] = asyncio.Queue()
        self._queued: set[int] = set()
        self._subscription: Subscription | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._warned_malformed = False

    @classmethod
    async def start(
        cls,
        connection: NatsConnection,
        plane: RequestPlane,
        registry: ModelRegistry,
        namespace: str,
        *,
        index: PrefixIndex,
        memory: PrefixMemory,
        metrics: RoutingMetrics,
    ) -> KvEventsListener:
        """Subscribe to ``namespace``'s events and ask every instance that publishes them for
        a snapshot."""
        listener = cls(connection, plane, registry, index, memory, metrics)
        client = connection.client
        subject = kv_events_subject(namespace)
        listener._subscription = await client.subscribe(subject, cb=listener._on_message)
        await client.flush()
        connection.add_listener(listener._on_nats_state)
        listener._snapshot_task = asyncio.create_task(listener._snapshot_loop())
        listener._ask_everyone()
        return listener

    async def aclose(self) -> None:
        """Stop listening and asking."""
        self.fleet.close()
        if self._snapshot_task is not None:
            await cancel_and_wait(self._snapshot_task)
        if self._subscription is not None and not self.connection.client.is_closed:
            try:
                await self._subscription.unsubscribe()
            except Exception as exc:
                log.warning("nats unsubscribe failed", error=str(exc))

    def follows(self, instance_id: int) -> bool:
        """Whether the index holds every block ``instance_id`` reported (the router may trust
        it for that instance)."""
        follow = self._follows.get(instance_id)
        return follow is not None and follow.following

    def followed(self) -> int:
        """How many instances the index follows now."""
        return sum(follow.following for follow in self._follows.values())

    async def _on_message(self, msg: Msg) -> None:
        try:
            batch = decode_kv_batch(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.metrics.dropped("malformed")
            if not self._warned_malformed:
                self._warned_malformed = True
                log.warning("skipping a malformed KV event message (logged once)", error=str(exc))
            return
        self.on_batch(batch)

    def on_batch(self, batch: KvEventBatch) -> None:
        """Apply ``batch`` if it is the next of its instance; else catch up by snapshot."""
        self.metrics.event_lag.observe(max(0.0, time.time() - batch.sent_at))
        iid = batch.instance_id
        if iid not in self.fleet.instances:
            self.metrics.dropped("unknown_instance", max(1, len(batch.events)))
            return
        follow = self._follows.setdefault(iid, _Follow())
        if follow.following and batch.seq == follow.seq + 1:
            self._apply(iid, follow, batch)
        elif batch.seq == 1:  # the worker's first batch since it (re)started: a clean slate
            self.index.remove_instance(iid)
            self._follows[iid] = _Follow(following=True)
            self._apply(iid, self._follows[iid], batch)
        elif follow.following and batch.seq <= follow.seq:
            log.info("kv events went back; the worker restarted", instance=f"{iid:x}")
            self._lose(iid, follow)
        else:
            self._wait(iid, follow, batch)

    def _apply(self, iid: int, follow: _Follow, batch: KvEventBatch) -> None:
        follow.seq = batch.seq
        known = [event for event in batch.events if self._known(iid, event)]
        dropped_before = self.index.dropped
        self.index.apply(iid, known)
        if full := self.index.dropped - dropped_before:
            self.metrics.dropped("index_full", full)

    def _known(self, iid: int, event: KvEvent) -> bool:
        """Whether ``event``'s version is one ``iid`` serves (``""``: every version)."""
        if isinstance(event, VersionCleared) and not event.version:
            return True
        if self.fleet.serves(iid, event.version):
            return True
        self.metrics.dropped("unknown_version")
        return False

    def _wait(self, iid: int, follow: _Follow, batch: KvEventBatch) -> None:
        """Keep ``batch`` for after the snapshot that a gap (or a late start) needs."""
        if follow.following:
            log.info("kv events skipped a batch; asking for a snapshot", instance=f"{iid:x}",
                     seq=batch.seq, expected=follow.seq + 1)  # fmt: skip
            follow.following = False
        if len(follow.waiting) < WAITING_BATCHES:
            follow.waiting.append(batch)
        else:
            follow.waiting.clear()
        self._ask(iid)

    def _lose(self, iid: int, follow: _Follow) -> None:
        """Stop trusting the index for ``iid`` until its snapshot comes."""
        follow.following = False
        follow.waiting.clear()
        self._ask(iid)

    def _instance_gone(self, iid: int) -> None:
        self._follows.pop(iid, None)
        self.index.remove_instance(iid)
        self.memory.forget_instance(iid)

    def _on_nats_state(self, state: NatsState) -> None:
        """Events may have been lost while NATS was away: trust nothing until snapshots."""
        if state is NatsState.CONNECTED:
            self._ask_everyone()
        else:
            for follow in self._follows.values():
                follow.following = False
                follow.waiting.clear()

    def _ask_everyone(self) -> None:
        for iid, instance in self.fleet.instances.items():
            if instance.kv_cache is not None and instance.kv_cache.events:
                self._lose(iid, self._follows.setdefault(iid, _Follow()))

    def _ask(self, iid: int) -> None:
        if iid not in self._queued:
            self._queued.add(iid)
            self._asked.put_nowait(iid)

    async def _snapshot_loop(self) -> None:
        """Ask the instances queued for a snapshot, one at a time, and apply each answer."""
        while True:
            iid = await self._asked.get()
            self._queued.discard(iid)
            follow = self._follows.get(iid)
            instance = self.fleet.instances.get(iid)
            if follow is None or instance is None or follow.following:
                continue
            snapshot = await self._snapshot(instance.subject)
            if snapshot is None or snapshot.instance_id != iid:
                self._retry_later(iid, follow)
            else:
                self._caught_up(iid, follow, snapshot)

    async def _snapshot(self, subject: str) -> KvSnapshot | None:
        """The instance's snapshot, or None (no answer in time, or not one)."""
        try:
            reply = await self.plane.open(subject, KvSnapshotRequest())
        except Exception as exc:
            log.info("kv snapshot not asked", subject=subject, error=str(exc))
            return None
        try:
            msg = await reply.next(SNAPSHOT_TIMEOUT_S)
        finally:
            reply.close()
        if msg is None or is_no_responders(msg):
            self.metrics.snapshots.labels("no_answer").inc()
            return None
        try:
            snapshot = decode_kv_snapshot(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.metrics.snapshots.labels("malformed").inc()
            return None
        self.metrics.snapshots.labels("ok").inc()
        return snapshot

    def _retry_later(self, iid: int, follow: _Follow) -> None:
        follow.failures += 1
        delay = backoff_s(follow.failures, cap_s=SNAPSHOT_RETRY_CAP_S)
        asyncio.get_running_loop().call_later(delay, self._ask, iid)

    def _caught_up(self, iid: int, follow: _Follow, snapshot: KvSnapshot) -> None:
        """Replace the instance's blocks with ``snapshot``, then apply the batches after it."""
        blocks = {v: hashes for v, hashes in snapshot.blocks.items() if self.fleet.serves(iid, v)}
        if unknown := len(snapshot.blocks) - len(blocks):
            self.metrics.dropped("unknown_version", unknown)
        self.index.replace(iid, blocks)
        follow.seq, follow.failures, follow.following = snapshot.seq, 0, True
        waiting, follow.waiting = sorted(follow.waiting, key=lambda b: b.seq), []
        for batch in waiting:
            if batch.seq > follow.seq:
                self.on_batch(batch)
        log.info("kv index caught up", instance=f"{iid:x}", seq=snapshot.seq,
                 blocks=sum(map(len, blocks.values())))  # fmt: skip
