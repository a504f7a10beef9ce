"""vLLM's KV cache events turned into the fleet's: its block hashes re-hashed into our chain.

vLLM publishes ``KVEventBatch`` messages over ZMQ (``kv_events_config``): ``BlockStored``
(``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id`` and, in
newer releases, ``lora_name`` and ``extra_keys``), ``BlockRemoved`` (``block_hashes``) and
``AllBlocksCleared``. Its hashes are its own (seeded per process), so each stored block is
hashed again with ``fleet.kv_blocks.block_hashes``, continuing from its parent's hash in our
chain, under the version the adapter table names for its LoRA. Kept free of vLLM imports
(events are read by attribute) so the main test suite checks it with synthetic events.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final, Protocol, TypeAlias

import structlog

from lorafleet.fleet.kv_blocks import HASH_BYTES, block_hashes
from lorafleet.proto.kv_events import BlocksRemoved, BlocksStored, VersionCleared
from lorafleet.worker import metrics
from lorafleet.worker.engine import KvEventSink

__all__ = ["KV_TOPIC", "VersionOf", "VllmKvEvents", "follow_zmq"]

log = structlog.get_logger(__name__)

KV_TOPIC: Final = "kv"
"""The ZMQ topic the engine asks vLLM to publish its KV events under."""

VersionOf: TypeAlias = Callable[[int | None, str | None], str | None]
"""The fleet version (``fleet.kv_blocks.version_key``) of vLLM's ``lora_id`` and
``lora_name`` (both None or 0 for the base model); None for an adapter no longer held."""


class _Stored(Protocol):
    block_hashes: Sequence[Hashable]
    parent_block_hash: Hashable | None
    token_ids: Sequence[int]
    block_size: int


class VllmKvEvents:
    """Re-hashes one vLLM engine's events and hands the fleet's to ``sink``.

    Example::

        events = VllmKvEvents(version_of=engine.version_of_lora, sink=relay.add)
        events.on_batch(decoded_batch)           # a vLLM KVEventBatch, decoded
        events.clear("pirate@sha256:0a1b...")    # the adapter version left the engine
    """

    def __init__(self, *, version_of: VersionOf, sink: KvEventSink) -> None:
        self._version_of = version_of
        self._sink = sink
        self._ours: dict[Hashable, tuple[int, str]] = {}
        """vLLM's hash of each block it holds -> our hash of it and its version."""
        self._reported: set[str] = set()

    def on_message(self, payload: bytes, decode: Callable[[bytes], Any]) -> None:
        """Decode one ZMQ message with vLLM's decoder and relay it; an undecodable one is
        dropped and counted."""
        try:
            batch = decode(payload)
        except Exception as exc:  # msgspec's errors, whatever vLLM's release decodes into
            self._drop("undecodable", "KVEventBatch", error=str(exc)[:200])
            return
        self.on_batch(batch)

    def on_batch(self, batch: Any) -> None:
        """Relay every event of one of vLLM's batches; a bad event is dropped and counted."""
        for event in getattr(batch, "events", ()):
            try:
                self._on_event(event)
            except (AttributeError, TypeError, ValueError) as exc:
                self._drop("malformed", type(event).__name__, error=str(exc))

    def clear(self, version: str) -> None:
        """Every block of ``version`` is unusable from now on (its adapter left vLLM)."""
        self._ours = {key: ours for key, ours in self._ours.items() if ours[1] != version}
        self._sink(VersionCleared(version=version))

    def _on_event(self, event: Any) -> None:
        kind = type(event).__name__
        if kind == "BlockStored":
            self._stored(event)
        elif kind == "BlockRemoved":
            self._removed(event.block_hashes)
        elif kind == "AllBlocksCleared":
            self._ours.clear()
            self._sink(VersionCleared(version=""))
        else:
            self._drop("unknown_kind", kind)

    def _stored(self, event: Any) -> None:
        lora_name = getattr(event, "lora_name", None)
        version = self._version_of(getattr(event, "lora_id", None), lora_name)
        if version is None:
            self._drop("unknown_version", "BlockStored", lora_name=lora_name)
            return
        start = b""
        if event.parent_block_hash is not None:
            parent = self._ours.get(event.parent_block_hash)
            if parent is None:  # stored before we listened, or gone since: no chain to extend
                self._drop("unknown_parent", "BlockStored")
                return
            start = parent[0].to_bytes(HASH_BYTES, "little", signed=True)
        ours = self._rehash(event, version, _salt(event, lora_name), start)
        self._ours.update(
            (theirs, (mine, version)) for theirs, mine in zip(event.block_hashes, ours, strict=True)
        )
        self._sink(BlocksStored(version=version, hashes=ours))

    @staticmethod
    def _rehash(event: _Stored, version: str, salt: str, start: bytes) -> list[int]:
        """Our hashes of the event's blocks; a ValueError unless its tokens fill them."""
        ours = block_hashes(event.token_ids, event.block_size, version, salt, start=start)
        if len(ours) != len(event.block_hashes) or len(event.token_ids) % event.block_size:
            raise ValueError(f"{len(event.token_ids)} tokens do not make "
                             f"{len(event.block_hashes)} blocks of {event.block_size}")  # fmt: skip
        return ours

    def _removed(self, hashes: Sequence[Hashable]) -> None:
        by_version: dict[str, list[int]] = {}
        for theirs in hashes:
            ours = self._ours.pop(theirs, None)
            if ours is not None:  # unknown: never relayed, or its version was cleared
                by_version.setdefault(ours[1], []).append(ours[0])
        for version, removed in by_version.items():
            self._sink(BlocksRemoved(version=version, hashes=removed))

    def _drop(self, reason: str, kind: str, **context: object) -> None:
        metrics.KV_EVENTS_DROPPED.labels(reason).inc()
        if reason not in self._reported:
            self._reported.add(reason)
            log.warning("vLLM KV event not relayed (logged once per reason)", reason=reason,
                        kv_event=kind, **context)  # fmt: skip


def _salt(event: Any, lora_name: str | None) -> str:
    """The cache salt of a chain's first block: the string among its ``extra_keys`` that is
    not the LoRA's name (vLLM mixes both into a first block's hash); "" when vLLM's release
    does not publish ``extra_keys`` (``docs/vllm_engine.md``)."""
    extra = getattr(event, "extra_keys", None)
    first = extra[0] if extra else None
    found = [key for key in first or () if isinstance(key, str) and key != lora_name]
    return found[-1] if found else ""


async def follow_zmq(endpoint: str, events: VllmKvEvents) -> None:
    """Receive vLLM's event batches on ``endpoint`` (its publisher binds it) until
    cancelled, decoding them with the installed vLLM's own ``KVEventBatch``."""
    import msgspec
    import zmq
    import zmq.asyncio
    from vllm.distributed.kv_events import KVEventBatch

    decode = msgspec.msgpack.Decoder(KVEventBatch).decode
    socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
    socket.setsockopt_string(zmq.SUBSCRIBE, KV_TOPIC)
    socket.connect(endpoint)
    try:
        while True:
            frames = await socket.recv_multipart()  # topic, sequence number, payload
            events.on_message(frames[-1], decode)
    finally:
        socket.close(linger=0)
