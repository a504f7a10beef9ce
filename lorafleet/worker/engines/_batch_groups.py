"""Admits requests so that rows of different groups never share an engine batch.

Used by the vllm engine on CPU, where base-model rows batched with adapter rows
get the wrong adapter applied (see ``worker.engines.vllm``). Pure asyncio: no
engine code here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Hashable

__all__ = ["BatchGroupGate"]


class BatchGroupGate:
    """Lets in requests of one group at a time, first come first served between groups.

    A request of the running group enters at once unless a request of another
    group is waiting; then it queues behind it, so no group starves. When the
    last request of the running group leaves, the group of the oldest waiter
    runs next and all its waiters enter together.

    Example::

        gate = BatchGroupGate()
        async with gate.admit("base"):
            ...  # no "adapter" request runs meanwhile
    """

    def __init__(self) -> None:
        self._running: Hashable | None = None
        self._active = 0
        self._waiting: deque[tuple[Hashable, asyncio.Future[None]]] = deque()

    @property
    def running_group(self) -> Hashable | None:
        """The group whose requests may run now; None when the gate is idle."""
        return self._running

    @property
    def waiting(self) -> int:
        """How many requests wait for their group's turn."""
        return len(self._waiting)

    @contextlib.asynccontextmanager
    async def admit(self, group: Hashable) -> AsyncIterator[None]:
        """Wait for ``group``'s turn, hold a place in it for the block, then leave."""
        await self._enter(group)
        try:
            yield
        finally:
            self._leave()

    async def _enter(self, group: Hashable) -> None:
        if self._running is None or (self._running == group and not self._waiting):
            self._running = group
            self._active += 1
            return
        entry = (group, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():
                self._leave()  # admitted just before the cancel arrived
            else:
                self._waiting.remove(entry)
            raise

    def _leave(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._running = None
            self._admit_next_group()

    def _admit_next_group(self) -> None:
        if not self._waiting:
            return
        group = self._waiting[0][0]
        self._running = group
        kept: deque[tuple[Hashable, asyncio.Future[None]]] = deque()
        for entry in self._waiting:
            if entry[0] == group:
                self._active += 1
                entry[1].set_result(None)
            else:
                kept.append(entry)
        self._waiting = kept
