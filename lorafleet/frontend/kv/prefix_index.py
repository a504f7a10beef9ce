"""Which instance holds which prefix-cache block: the index every frontend builds from events.

A block is a 64-bit hash that names a whole prefix of one model version under one cache
salt (``fleet.kv_blocks``), so the index need not know versions to match a request; it
keeps them only to drop one version's blocks of one instance at once (a swap, an unload).
The index is bounded by a count of blocks (``max_blocks``): past it, new blocks are not
indexed and are counted, so a flood of distinct prefixes costs routing quality, never
memory. Pure bookkeeping, no I/O: ``frontend.kv.events_listener`` feeds it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Final

from lorafleet.proto.kv_events import BlocksRemoved, BlocksStored, KvEvent, VersionCleared

__all__ = ["DEFAULT_MAX_BLOCKS", "PrefixIndex"]

DEFAULT_MAX_BLOCKS: Final = 1_048_576
"""Blocks indexed at most across every instance (about 200 bytes each: ~200 MiB)."""


class PrefixIndex:
    """Block hash -> instances holding it, and per instance per version its blocks.

    Holders are kept as a bit mask per block (one bit per instance indexed): a mask of a
    few instances is a small int Python shares, where a set per block cost an object of
    its own, and the events' stores and removals touch every block."""

    def __init__(self, *, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        self.max_blocks = max_blocks
        self._holders: dict[int, int] = {}
        """Block hash -> the mask of the instances holding it."""
        self._bits: dict[int, int] = {}
        """Instance -> its bit in the masks, while it holds a block."""
        self._held: dict[int, dict[str, set[int]]] = {}
        self._size = 0
        self.dropped = 0
        """Blocks not indexed because the index was full."""

    @property
    def size(self) -> int:
        """Blocks indexed now, an instance's copy of a block counted once per instance."""
        return self._size

    def instances(self) -> set[int]:
        """Instances with at least one block indexed."""
        return set(self._held)

    def blocks_of(self, instance_id: int, version: str) -> int:
        """How many blocks of ``version`` ``instance_id`` holds."""
        return len(self._held.get(instance_id, {}).get(version, ()))

    def apply(self, instance_id: int, events: Iterable[KvEvent]) -> None:
        """Apply an instance's events in order."""
        for event in events:
            if isinstance(event, BlocksStored):
                self._store(instance_id, event.version, event.hashes)
            elif isinstance(event, BlocksRemoved):
                self._remove(instance_id, event.version, event.hashes)
            elif isinstance(event, VersionCleared):
                if event.version:
                    self.remove_version(instance_id, event.version)
                else:
                    self.remove_instance(instance_id)

    def replace(self, instance_id: int, blocks: Mapping[str, Sequence[int]]) -> None:
        """Hold exactly ``blocks`` (by version) for ``instance_id`` (a snapshot)."""
        self.remove_instance(instance_id)
        for version, hashes in blocks.items():
            self._store(instance_id, version, hashes)

    def remove_instance(self, instance_id: int) -> None:
        """Forget every block of ``instance_id`` (it left, restarted or was reset)."""
        for version in list(self._held.get(instance_id, ())):
            self.remove_version(instance_id, version)

    def remove_version(self, instance_id: int, version: str) -> None:
        """Forget every block of ``version`` on ``instance_id``."""
        versions = self._held.get(instance_id)
        if versions is None or version not in versions:
            return
        self._remove(instance_id, version, list(versions[version]))

    def overlaps(self, hashes: Iterable[int], candidates: Collection[int]) -> dict[int, int]:
        """For each of ``candidates`` holding the first of ``hashes``, how many leading blocks
        of ``hashes`` it holds (an instance that misses a block holds none after it for this
        request: each hash names its whole prefix). Reads ``hashes`` no further than the
        first block none of them holds."""
        alive = {iid: self._bits[iid] for iid in candidates if iid in self._bits}
        found: dict[int, int] = {}
        if not alive:
            return found
        for depth, block in enumerate(hashes):
            mask = self._holders.get(block, 0)
            alive = {iid: bit for iid, bit in alive.items() if mask & bit}
            if not alive:
                break
            for instance_id in alive:
                found[instance_id] = depth + 1
        return found

    def _store(self, instance_id: int, version: str, hashes: Iterable[int]) -> None:
        held = self._held.setdefault(instance_id, {}).setdefault(version, set())
        bit = self._bit(instance_id)
        holders = self._holders
        for block in hashes:
            if block in held:
                continue
            if self._size >= self.max_blocks:
                self.dropped += 1
                continue
            held.add(block)
            holders[block] = holders.get(block, 0) | bit
            self._size += 1

    def _remove(self, instance_id: int, version: str, hashes: Iterable[int]) -> None:
        versions = self._held.get(instance_id)
        held = versions.get(version) if versions is not None else None
        if versions is None or held is None:
            return
        others = ~self._bits[instance_id]
        holders = self._holders
        for block in hashes:
            if block not in held:
                continue
            held.discard(block)
            self._size -= 1
            if mask := holders[block] & others:
                holders[block] = mask
            else:
                del holders[block]
        if not held:
            del versions[version]
        if not versions:
            del self._held[instance_id]
            del self._bits[instance_id]

    def _bit(self, instance_id: int) -> int:
        """``instance_id``'s bit, the lowest one free if it has none yet."""
        if (bit := self._bits.get(instance_id)) is None:
            used = sum(self._bits.values())
            bit = self._bits[instance_id] = ~used & (used + 1)
        return bit
