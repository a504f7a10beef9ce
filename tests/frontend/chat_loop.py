"""A client that keeps chatting to one model through a frontend while a test changes the fleet."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import openai

__all__ = ["ChatLoop"]

PROGRESS_TIMEOUT_S = 60.0
"""How long ``more`` waits for each answer (a busy 2-core CI box)."""


class ChatLoop:
    """Sends one request after another (``ask`` returns what the test keeps of an answer)
    until stopped; keeps every answer and every error, none retried."""

    def __init__(self, ask: Callable[[], Awaitable[str]]) -> None:
        self.answers: list[str] = []
        self.errors: list[str] = []
        self._ask = ask
        self._progress = asyncio.Event()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.answers.append(await self._ask())
            except openai.APIStatusError as exc:
                self.errors.append(f"{exc.status_code} {exc.message}")
            except openai.APIError as exc:
                self.errors.append(f"{type(exc).__name__}: {exc.message}")
            self._progress.set()

    @property
    def ended(self) -> int:
        """Requests answered or failed so far."""
        return len(self.answers) + len(self.errors)

    async def more(self, count: int) -> None:
        """Wait until ``count`` more requests have ended."""
        target = self.ended + count
        while self.ended < target:
            self._progress.clear()
            await asyncio.wait_for(self._progress.wait(), PROGRESS_TIMEOUT_S)

    async def stop(self) -> list[str]:
        """Stop after the running request; the errors seen."""
        self._stop.set()
        await asyncio.wait_for(self._task, PROGRESS_TIMEOUT_S)
        return self.errors
