"""An engine's adapter handles by key, and the requests running on each key, to end leftovers.

Only what an engine needs to serve and to end what still runs when the controller removes a
version: the bookkeeping (slots, ids, collisions) and the drain are
``worker.lora_controller``'s. Kept free of vLLM imports so the main test suite checks it.

The running requests are the engine's own request ids (vLLM's ``{request_id}-{n}``, fresh
per call so a migrated continuation never collides), by engine key. The controller's
``AdapterVersion.busy`` counts the same requests for its own rules (drain, eviction) but
cannot hold these ids: it counts before the engine picks them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

__all__ = ["AdapterTable"]

H = TypeVar("H")


class AdapterTable(Generic[H]):
    """Handles (vLLM's ``LoRARequest``) by engine key, and the requests running on each key.

    Example::

        table.handles["pirate@0a1b2c3d4e5f"] = handle
        async with table.tracked("pirate@0a1b2c3d4e5f", "req-1-0"):
            ...                                  # table.was_cut("req-1-0") after a removal
        del table.handles["pirate@0a1b2c3d4e5f"]
        for request_id in table.cut("pirate@0a1b2c3d4e5f"):
            ...                                  # end it (vLLM: abort)
    """

    def __init__(self) -> None:
        self.handles: dict[str, H] = {}
        self._running: dict[str, set[str]] = {}
        self._cut: set[str] = set()

    @contextlib.asynccontextmanager
    async def tracked(self, key: str, request_id: str) -> AsyncIterator[None]:
        """Count ``request_id`` as running on ``key`` for the block."""
        self._running.setdefault(key, set()).add(request_id)
        try:
            yield
        finally:
            self._running.get(key, set()).discard(request_id)
            self._cut.discard(request_id)

    def running(self, key: str) -> list[str]:
        """Ids of the requests running on ``key`` now."""
        return sorted(self._running.get(key, ()))

    def cut(self, key: str) -> list[str]:
        """The ids of the requests still running on ``key``, marked as cut off from it: the
        version was removed under them (they outlasted the drain)."""
        cut = sorted(self._running.pop(key, ()))
        self._cut.update(cut)
        return cut

    def was_cut(self, request_id: str) -> bool:
        """Whether the version ``request_id`` runs on was removed under it."""
        return request_id in self._cut
