"""Where this frontend sent which prefix lately: the router's approximate mode.

For instances that publish no block events (hf), and for those whose events this frontend
has not caught up with yet (it started late, it missed a batch), the router assumes an
instance still holds the prefixes it was sent within ``ttl_s``. Sends to instances it
follows go to ``RecentSends`` instead, which keeps a memory of its own for the prompts it
hashes. Entries are bounded by count (``max_blocks``, least recently used out first), so a
flood of distinct prefixes costs memory only up to the bound. Pure bookkeeping, no I/O.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Final

__all__ = ["DEFAULT_MEMORY_BLOCKS", "DEFAULT_MEMORY_TTL_S", "PrefixMemory"]

DEFAULT_MEMORY_TTL_S: Final = 120.0
"""How long a prefix sent to an instance is assumed cached there (engines evict by LRU:
a prefix not asked for in minutes is likely gone on a busy engine)."""
DEFAULT_MEMORY_BLOCKS: Final = 262_144
"""Blocks remembered at most (about 250 bytes each: ~64 MiB)."""


class PrefixMemory:
    """Block hash -> the instances it was sent to and when it was last sent to each."""

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_MEMORY_TTL_S,
        max_blocks: int = DEFAULT_MEMORY_BLOCKS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0 or max_blocks < 1:
            raise ValueError(f"ttl_s must be > 0 and max_blocks >= 1: {ttl_s}, {max_blocks}")
        self.ttl_s = ttl_s
        self.max_blocks = max_blocks
        self._clock = clock
        self._sent: OrderedDict[int, dict[int, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sent)

    def remember(self, hashes: Sequence[int], instance_id: int, at: float | None = None) -> None:
        """``instance_id`` was sent ``hashes`` (now, or ``at`` on the memory's clock): assume
        it holds them for ``ttl_s``."""
        now = self._clock() if at is None else at
        for block in hashes:
            holders = self._sent.get(block)
            if holders is None:
                holders = self._sent[block] = {}
            else:
                self._sent.move_to_end(block)
            holders[instance_id] = now
        while len(self._sent) > self.max_blocks:
            self._sent.popitem(last=False)

    def overlaps(
        self, hashes: Iterable[int], candidates: Collection[int], within_s: float | None = None
    ) -> dict[int, int]:
        """For each of ``candidates`` sent the first of ``hashes`` in the last ``within_s``
        (``ttl_s`` by default), how many leading blocks of ``hashes`` it was sent since."""
        since = self._clock() - (self.ttl_s if within_s is None else within_s)
        found: dict[int, int] = {}
        alive = set(candidates)
        for depth, block in enumerate(hashes):
            holders = self._sent.get(block, {})
            alive = {i for i in alive if holders.get(i, since) > since}
            if not alive:
                break
            for instance_id in alive:
                found[instance_id] = depth + 1
        return found

    def forget_instance(self, instance_id: int) -> None:
        """Drop every memory of ``instance_id`` (it left the fleet)."""
        for block in list(self._sent):
            holders = self._sent[block]
            if holders.pop(instance_id, None) is not None and not holders:
                del self._sent[block]
