"""The blocks an instance holds, by version, exactly as its published events say.

The relay applies every event it sends to this mirror, so a snapshot is by construction
what a frontend that saw every batch holds, whichever engine produced the events. Pure.
"""

from __future__ import annotations

from lorafleet.proto.kv_events import BlocksRemoved, BlocksStored, KvEvent, VersionCleared

__all__ = ["KvMirror"]


class KvMirror:
    """Block hashes by version, in the order they were stored.

    Example::

        mirror = KvMirror()
        mirror.apply(BlocksStored(version="demo", hashes=[1, 2]))
        mirror.blocks()   # {"demo": [1, 2]}
    """

    def __init__(self) -> None:
        self._by_version: dict[str, dict[int, None]] = {}

    def apply(self, event: KvEvent) -> None:
        """Change the mirror as ``event`` says (``VersionCleared("")``: everything went)."""
        match event:
            case BlocksStored(version=version, hashes=hashes):
                held = self._by_version.setdefault(version, {})
                held.update(dict.fromkeys(hashes))
            case BlocksRemoved(version=version, hashes=hashes):
                held = self._by_version.get(version, {})
                for block_hash in hashes:
                    held.pop(block_hash, None)
                if not held:
                    self._by_version.pop(version, None)
            case VersionCleared(version=""):
                self._by_version.clear()
            case VersionCleared(version=version):
                self._by_version.pop(version, None)

    def blocks(self) -> dict[str, list[int]]:
        """Every block held, by version."""
        return {version: list(held) for version, held in self._by_version.items()}

    def counts(self) -> dict[str, int]:
        """How many blocks each version holds."""
        return {version: len(held) for version, held in self._by_version.items()}
