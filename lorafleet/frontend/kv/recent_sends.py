"""Prompts this frontend sent lately to instances whose events it follows: held there before
their events say so.

A prompt's blocks reach the index only once the engine has prefilled them and the relay's
next batch has crossed NATS; a request for the same prefix meanwhile must still go where the
first was sent, or concurrent requests for a new prefix scatter over every instance. A send
is filed under its prompt's first block with its lazy block chain, and hashed whole into a
``PrefixMemory`` only when a later prompt starts with the same block: a prompt no other
shares costs one block's hash, not its whole length's. Sends count for ``window_s``; at most
``max_sends`` wait unhashed (the oldest out first). Pure bookkeeping, no I/O.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Final, NamedTuple

from lorafleet.fleet.kv_blocks import BlockChain
from lorafleet.frontend.kv.prefix_memory import PrefixMemory

__all__ = ["RECENT_S", "RecentSends"]

RECENT_S: Final = 5.0
"""How long a sent prompt counts as held without its event: its prefill and the relay's
next batch take less."""
MAX_SENDS: Final = 4096
"""Sends kept unhashed at most (each holds its request's prompt): 5 s of 800 a second."""
MAX_BLOCKS: Final = 65_536
"""Blocks of hashed sends kept at most (``PrefixMemory``'s bound, about 16 MiB)."""


class _Send(NamedTuple):
    sent_at: float
    first: int
    instance_id: int
    chain: BlockChain


class RecentSends:
    """Which instance was sent which prompt in the last ``window_s``."""

    def __init__(
        self,
        *,
        window_s: float = RECENT_S,
        max_sends: int = MAX_SENDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.max_sends = max_sends
        self._clock = clock
        self._waiting: deque[_Send] = deque()
        self._by_first: dict[int, list[_Send]] = {}
        """The sends not hashed yet, by their first block's hash."""
        self._hashed = PrefixMemory(ttl_s=window_s, max_blocks=MAX_BLOCKS, clock=clock)

    def remember(self, chain: BlockChain, instance_id: int) -> None:
        """``instance_id`` was sent the prompt of ``chain`` now."""
        first = chain.first()
        if first is None:
            return
        now = self._clock()
        send = _Send(now, first, instance_id, chain)
        self._waiting.append(send)
        self._by_first.setdefault(first, []).append(send)
        self._expire(now - self.window_s)

    def held_blocks(self, chain: BlockChain, instance_ids: Collection[int]) -> dict[int, int]:
        """For each of ``instance_ids`` sent a prompt starting like ``chain`` lately, how
        many leading blocks of ``chain`` it was sent."""
        first = chain.first()
        if first is None:
            return {}
        for send in self._by_first.pop(first, ()):
            self._hashed.remember(list(send.chain), send.instance_id, at=send.sent_at)
        return self._hashed.overlaps(chain, instance_ids) if self._hashed else {}

    def _expire(self, since: float) -> None:
        """Drop the sends made at ``since`` or before, and the oldest past ``max_sends``."""
        while self._waiting and (self._waiting[0].sent_at <= since
                                 or len(self._waiting) > self.max_sends):  # fmt: skip
            oldest = self._waiting.popleft()
            same_first = self._by_first.get(oldest.first)
            if same_first and same_first[0] is oldest:  # else it was hashed already
                same_first.pop(0)
                if not same_first:
                    del self._by_first[oldest.first]
