"""Which instance holds which prefix-cache block: the index every frontend builds from events.

A block is a 64-bit hash that names a whole prefix of one model version under one cache
salt (``fleet.kv_blocks``), so the index need not know versions to match a request; it
keeps them only to drop one version's blocks of one instance at once (a swap, an unload).
The index is bounded by a count of blocks (``max_blocks``): past it, new blocks are not
indexed and are counted, so a flood of distinct prefixes costs routing quality, never
memory. Pure bookkeeping, no I/O: ``frontend.kv.events_listener`` feeds it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Final

from lorafleet.proto.kv_events import BlocksRemoved, BlocksStored, KvEvent, VersionCleared

__all__ = ["DEFAULT_MAX_BLOCKS", "PrefixIndex"]

DEFAULT_MAX_BLOCKS: Final = 1_048_576
"""Blocks indexed at most across every instance (about 90 bytes each: ~90 MiB)."""


class PrefixIndex:
    """Per instance the blocks it holds, all versions in one set and each version in one.

    The workers' stores and removals touch every block of every prompt, so they are set
    operations over a whole event's hashes at once (``set.update``,
    ``set.difference_update``), not a step of Python per block; matching a request walks
    its chain against each candidate's set."""

    def __init__(self, *, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        self.max_blocks = max_blocks
        self._blocks: dict[int, set[int]] = {}
        """Instance -> every block it holds, whatever the version (what requests match)."""
        self._held: dict[int, dict[str, set[int]]] = {}
        """Instance -> version -> its blocks of that version (what a swap or unload drops)."""
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

    def replace(self, instance_id: int, blocks: Mapping[str, Collection[int]]) -> None:
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
        self._remove(instance_id, version, versions[version])

    def overlaps(self, hashes: Iterable[int], candidates: Collection[int]) -> dict[int, int]:
        """For each of ``candidates`` holding the first of ``hashes``, how many leading blocks
        of ``hashes`` it holds (an instance that misses a block holds none after it for this
        request: each hash names its whole prefix). Reads ``hashes`` no further than the
        first block none of them holds."""
        alive = [(iid, self._blocks[iid]) for iid in candidates if iid in self._blocks]
        found: dict[int, int] = {}
        if not alive:
            return found
        for depth, block in enumerate(hashes, start=1):
            alive = [holder for holder in alive if block in holder[1]]
            if not alive:
                break
            for instance_id, _ in alive:
                found[instance_id] = depth
        return found

    def _store(self, instance_id: int, version: str, hashes: Collection[int]) -> None:
        held = self._held.setdefault(instance_id, {}).setdefault(version, set())
        blocks = self._blocks.setdefault(instance_id, set())
        if self._size + len(hashes) > self.max_blocks:  # near the bound: block by block
            hashes = self._room_for(held, hashes)
        before = len(held)
        held.update(hashes)
        blocks.update(hashes)
        self._size += len(held) - before

    def _room_for(self, held: set[int], hashes: Collection[int]) -> list[int]:
        """The new blocks of ``hashes`` that fit under the bound; the others are dropped."""
        new = list(dict.fromkeys(block for block in hashes if block not in held))
        room = max(0, self.max_blocks - self._size)
        self.dropped += max(0, len(new) - room)
        return new[:room]

    def _remove(self, instance_id: int, version: str, hashes: Collection[int]) -> None:
        versions = self._held.get(instance_id)
        held = versions.get(version) if versions is not None else None
        if versions is None or held is None:
            return
        before = len(held)
        self._blocks[instance_id].difference_update(hashes)  # first: ``hashes`` may be ``held``
        held.difference_update(hashes)
        self._size -= before - len(held)
        if not held:
            del versions[version]
        if not versions:
            del self._held[instance_id]
            del self._blocks[instance_id]
