"""What workers tell frontends about their engines' KV caches: cache shape and block events.

A worker that caches prompt blocks describes its cache on its ``Instance`` record
(:class:`KvCacheSpec`) and publishes what its engine stores and drops as
:class:`KvEventBatch` messages on the namespace's events subject
(``discovery.keys.kv_events_subject``); every frontend builds the same index from them
(``docs/routing.md``). A frontend that missed a batch (a gap in ``seq``) asks the instance
for a :class:`KvSnapshot` with a ``KvSnapshotRequest`` on its instance subject.

Block hashes are lorafleet's own (``fleet.kv_blocks.block_hashes``), never an engine's: a
hash names a whole prefix of one model version under one cache salt, so the same number
means the same cached tokens on every worker. Do no I/O here.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "BlocksRemoved",
    "BlocksStored",
    "KvCacheSpec",
    "KvEvent",
    "KvEventBatch",
    "KvSnapshot",
    "TokenizerKind",
    "VersionCleared",
    "decode_kv_batch",
    "decode_kv_snapshot",
]

TokenizerKind = Literal["words", "hf"]
"""How a frontend turns a request into the engine's tokens: ``words`` (the mocker's:
``fleet.kv_blocks.words_tokens``) or ``hf`` (the model folder's tokenizer and chat template,
at ``KvCacheSpec.tokenizer_path``)."""


class KvCacheSpec(msgspec.Struct, kw_only=True, frozen=True):
    """An engine's prefix cache as routers need to know it (on the ``Instance`` record)."""

    block_size: int
    """Tokens per block: only whole blocks are cached and hashed."""
    num_blocks: int
    """Blocks the engine holds at most (what an index may keep for this instance)."""
    events: bool = True
    """Whether the instance publishes block events (False: routers remember where they sent
    prefixes instead, ``docs/routing.md``, "Approximate mode")."""
    tokenizer: TokenizerKind = "words"
    tokenizer_path: str = ""
    """With ``tokenizer="hf"``: the model folder holding ``tokenizer.json`` and the chat
    template, as the worker sees it (a frontend that cannot read it routes approximately)."""


class _Event(msgspec.Struct, kw_only=True, frozen=True, tag_field="kind"):
    """Base of block events; ``version`` is ``fleet.kv_blocks.version_key``'s value."""

    version: str


class BlocksStored(_Event, frozen=True, tag="stored"):
    """The engine now holds these blocks, in chain order (each hash names its whole prefix)."""

    hashes: list[int]


class BlocksRemoved(_Event, frozen=True, tag="removed"):
    """The engine dropped these blocks (evicted, or their version left)."""

    hashes: list[int]


class VersionCleared(_Event, frozen=True, tag="cleared"):
    """Every block of ``version`` is gone (unload, swap, eviction); ``""``: of every version
    (the engine restarted or reset its cache)."""


KvEvent = BlocksStored | BlocksRemoved | VersionCleared


class KvEventBatch(msgspec.Struct, kw_only=True, frozen=True):
    """One message on the events subject: an instance's events since its last batch.

    ``seq`` counts batches from 1 per instance run; a frontend that sees ``seq`` jump asks
    for a snapshot, and one that sees it go back treats the instance as restarted.
    """

    instance_id: int
    seq: int
    sent_at: float
    """The worker's wall clock when it sent the batch (the frontends' event lag)."""
    events: list[KvEvent] = msgspec.field(default_factory=list)


class KvSnapshot(msgspec.Struct, kw_only=True, frozen=True):
    """Every block an instance holds now, by version, as of batch ``seq`` (the answer to a
    ``KvSnapshotRequest``): a frontend replaces what it held for the instance with it."""

    instance_id: int
    seq: int
    blocks: dict[str, list[int]] = msgspec.field(default_factory=dict)


_batch_decoder = msgspec.msgpack.Decoder(KvEventBatch)
_snapshot_decoder = msgspec.msgpack.Decoder(KvSnapshot)


def decode_kv_batch(data: bytes) -> KvEventBatch:
    """Decode an events message; raises ``msgspec`` errors on bad input."""
    return _batch_decoder.decode(data)


def decode_kv_snapshot(data: bytes) -> KvSnapshot:
    """Decode a snapshot reply; raises ``msgspec`` errors on bad input."""
    return _snapshot_decoder.decode(data)
