"""The vllm engine's adapter handles by name, and the requests running on each name.

Only what the engine needs to serve and drain: the bookkeeping (slots, ids,
collisions) is ``worker.lora_controller``'s. Kept free of vLLM imports so the
main test suite checks it.

The running requests are vLLM's request ids (``{request_id}-{n}``, fresh per call so a
migrated continuation never collides), by engine key: removing an adapter waits for them
and then aborts the ones left, which needs the ids. The controller's ``AdapterVersion.busy``
counts the same requests for its own rules (drain, eviction) but cannot hold these ids: it
counts before the engine picks them, and mocker and hf have none.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

__all__ = ["AdapterTable"]

H = TypeVar("H")


class AdapterTable(Generic[H]):
    """Handles (vLLM's ``LoRARequest``) by adapter name, and the requests running on each name.

    Example::

        table.handles["pirate"] = handle
        async with table.tracked("pirate", "req-1"):
            ...
        still_running = await table.wait_idle("pirate", timeout_s=30)
    """

    def __init__(self) -> None:
        self.handles: dict[str, H] = {}
        self._inflight: dict[str, set[str]] = {}
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def tracked(self, model: str, request_id: str) -> AsyncIterator[None]:
        """Count ``request_id`` as running on ``model`` for the block."""
        self._inflight.setdefault(model, set()).add(request_id)
        try:
            yield
        finally:
            self._inflight[model].discard(request_id)
            async with self._changed:
                self._changed.notify_all()

    def running(self, model: str) -> list[str]:
        """Ids of the requests running on ``model`` now."""
        return sorted(self._inflight.get(model, ()))

    async def wait_idle(self, model: str, timeout_s: float) -> list[str]:
        """Wait up to ``timeout_s`` for ``model``'s requests to end; return those still running."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: not self._inflight.get(model)), timeout_s
                )
        return self.running(model)
