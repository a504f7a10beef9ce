"""An open-loop load generator: streamed chat requests leave at a fixed rate, answered or not.

A closed loop (``bench._load``) sends less when the servers slow down, which
hides cold starts and queueing; an open loop keeps offering the same rate, as
independent users do, so every wait shows as latency. Each request takes an
idle keep-alive connection from a pool, or opens one when every connection is
busy.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from bench._http import HttpConnection, HttpResponse, complete_stream

__all__ = ["Planned", "Sample", "run_open_loop"]

HOST: Final = "127.0.0.1"
IDLE_REUSE_S: Final = 2.0
"""A connection idle longer is closed, not reused: uvicorn closes idle ones after 5 s."""
_ERROR_CODE: Final = re.compile(rb'"code":"([^"]*)"')
_ERROR_MESSAGE: Final = re.compile(rb'"message":"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Planned:
    """One request to send: a caller's tag (e.g. an adapter's rank) and its pre-built bytes."""

    tag: int
    raw: bytes


@dataclass(frozen=True, slots=True)
class Sample:
    """One request's result: its place in the plan, its tag, success and time to first token."""

    index: int
    tag: int
    ok: bool
    ttft_s: float | None
    failure: str = ""
    """Why it failed: ``timeout``, ``connection``, ``HTTP <status>``, an error event's code."""
    message: str = ""
    """The server's error message, when it sent one: what a failure's figures cannot say."""


class _Pool:
    """Idle keep-alive connections to one port; a busy pool grows by one connection.

    A connection the server may have closed for idling is never reused, so a
    failure is the server's answer, not the pool's stale socket.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[HttpConnection, float]] = []
        """Connections and when they went idle (perf_counter), the latest last."""

    async def request(self, raw: bytes) -> HttpResponse:
        connection = await self._take()
        try:
            response = await connection.request(raw, watch_tokens=True)
        except BaseException:
            await connection.close()
            raise
        self.idle.append((connection, time.perf_counter()))
        return response

    async def _take(self) -> HttpConnection:
        fresh_since = time.perf_counter() - IDLE_REUSE_S
        while self.idle:
            connection, idle_since = self.idle.pop()
            if idle_since >= fresh_since:
                return connection
            await connection.close()
        return await HttpConnection.open(HOST, self.port)

    async def aclose(self) -> None:
        for connection, _ in self.idle:
            await connection.close()


async def _send(pool: _Pool, index: int, planned: Planned, timeout_s: float) -> Sample:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            response = await pool.request(planned.raw)
    except TimeoutError:
        return Sample(index, planned.tag, ok=False, ttft_s=None, failure="timeout")
    except (OSError, asyncio.IncompleteReadError):
        return Sample(index, planned.tag, ok=False, ttft_s=None, failure="connection")
    first_token_at = response.first_token_at
    if first_token_at is None or not complete_stream(response):
        message = _ERROR_MESSAGE.search(response.body)
        return Sample(
            index, planned.tag, ok=False, ttft_s=None, failure=_failure(response),
            message=message[1].decode(errors="replace") if message else "",
        )  # fmt: skip
    return Sample(index, planned.tag, ok=True, ttft_s=first_token_at - started)


def _failure(response: HttpResponse) -> str:
    """What went wrong with an answer that was no complete stream."""
    if response.status != 200:
        code = _ERROR_CODE.search(response.body)
        return f"HTTP {response.status}" + (f" {code[1].decode()}" if code else "")
    code = _ERROR_CODE.search(response.body)
    return f"error event {code[1].decode()}" if code else "cut short"


async def run_open_loop(
    port: int, plan: Sequence[Planned], *, rate_per_s: float, timeout_s: float
) -> list[Sample]:
    """Send ``plan`` in order, request ``i`` at ``i / rate_per_s`` s; wait for every answer."""
    pool = _Pool(port)
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    try:
        for index, planned in enumerate(plan):
            delay = start + index / rate_per_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the schedule itself, not a synchronisation
            tasks.append(asyncio.create_task(_send(pool, index, planned, timeout_s)))
        return list(await asyncio.gather(*tasks))
    finally:
        await pool.aclose()
