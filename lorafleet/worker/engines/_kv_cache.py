"""The mocker's paged KV cache: blocks by chained hash, prefix reuse, LRU eviction of idle blocks.

Pure bookkeeping, no I/O and no clock: the mocker asks it which leading blocks of a request
it holds (the hits), has it store the rest, pins them while the request runs, and hears
what it stored and dropped as ``proto.kv_events`` events through a sink (the worker's
relay publishes them). Hashes are ``fleet.kv_blocks.block_hashes``: one per block, naming
its whole prefix under one model version and cache salt, so one hash belongs to one version.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from lorafleet.proto.kv_events import BlocksRemoved, BlocksStored, VersionCleared
from lorafleet.worker.engine import KvEventSink

__all__ = ["Held", "KvCache"]


@dataclass(frozen=True)
class Held:
    """What one ``hold`` did: leading blocks found already cached, and the blocks it pinned
    (hand them back to ``release``)."""

    hits: int
    pinned: list[int] = field(default_factory=list)


@dataclass
class _Block:
    version: str
    refs: int = 0
    """Running requests holding it; at 0 it waits in the LRU order for eviction."""


class KvCache:
    """At most ``num_blocks`` blocks of ``block_size`` tokens; idle blocks leave oldest first.

    Example::

        cache = KvCache(block_size=16, num_blocks=2048, sink=relay.add)
        held = cache.hold("pirate@sha256:0a1b", hashes)   # held.hits leading blocks were cached
        ...                                               # prefill the rest, generate
        cache.release(held.pinned)
    """

    def __init__(self, *, block_size: int, num_blocks: int, sink: KvEventSink) -> None:
        if block_size < 1 or num_blocks < 1:
            raise ValueError(f"a KV cache needs block_size >= 1 and num_blocks >= 1, not "
                             f"{block_size} and {num_blocks}")  # fmt: skip
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._sink = sink
        self._blocks: dict[int, _Block] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()
        """Blocks no request holds, least recently used first: eviction takes from the front."""

    def hold(self, version: str, hashes: Sequence[int]) -> Held:
        """Pin a request's blocks (``hashes``, in chain order), storing those not cached while
        there is room (evicting idle blocks); a block that finds no room ends the storing."""
        hits = next((i for i, h in enumerate(hashes) if h not in self._blocks), len(hashes))
        pinned: list[int] = []
        stored: list[int] = []
        evicted: dict[str, list[int]] = {}
        for block_hash in hashes:
            block = self._blocks.get(block_hash)
            if block is None:
                if not self._make_room(evicted):
                    break
                block = self._blocks[block_hash] = _Block(version)
                stored.append(block_hash)
            block.refs += 1
            self._idle.pop(block_hash, None)
            pinned.append(block_hash)
        for old_version, removed in evicted.items():
            self._sink(BlocksRemoved(version=old_version, hashes=removed))
        if stored:
            self._sink(BlocksStored(version=version, hashes=stored))
        return Held(hits=hits, pinned=pinned)

    def release(self, pinned: Sequence[int]) -> None:
        """A request ended: its blocks stay cached and become evictable once no request holds
        them (blocks cleared meanwhile are skipped)."""
        for block_hash in pinned:
            block = self._blocks.get(block_hash)
            if block is None:
                continue
            block.refs -= 1
            if block.refs == 0:
                self._idle[block_hash] = None

    def clear(self, version: str) -> None:
        """Drop every block of ``version`` (it left the engine), pinned or not."""
        gone = [h for h, block in self._blocks.items() if block.version == version]
        for block_hash in gone:
            del self._blocks[block_hash]
            self._idle.pop(block_hash, None)
        self._sink(VersionCleared(version=version))

    def blocks(self) -> dict[str, int]:
        """Blocks held now, by version."""
        counts: dict[str, int] = {}
        for block in self._blocks.values():
            counts[block.version] = counts.get(block.version, 0) + 1
        return counts

    def _make_room(self, evicted: dict[str, list[int]]) -> bool:
        """Room for one more block, evicting the least recently used idle one if full;
        False when every block is pinned."""
        if len(self._blocks) < self.num_blocks:
            return True
        if not self._idle:
            return False
        victim, _ = self._idle.popitem(last=False)
        block = self._blocks.pop(victim)
        evicted.setdefault(block.version, []).append(victim)
        return True
