"""A closed-loop load generator: N tasks, each sending its next request when the last returns.

A step runs a warm-up, then a measured window of fixed length; only requests
that finish inside the window count. CPU seconds of the watched processes are
read at the window's edges.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from bench._report import CpuMeter, ms, percentile

__all__ = ["Call", "Outcome", "Record", "Session", "StepResult", "closed_loop", "run_step"]


@dataclass(slots=True)
class Outcome:
    """One request's result: whether it succeeded and, for streams, when its first token came."""

    ok: bool
    first_token_at: float | None = None


Call: TypeAlias = Callable[[], Awaitable[Outcome]]
"""Send one request and wait for its whole answer."""
Session: TypeAlias = Callable[[], Awaitable[tuple[Call, Callable[[], Awaitable[None]]]]]
"""Open one task's client (a connection): returns its call and its close."""


@dataclass
class StepResult:
    """Figures of one measured window."""

    concurrency: int
    window_s: float
    latencies_s: list[float] = field(default_factory=list)
    first_tokens_s: list[float] = field(default_factory=list)
    errors: int = 0
    cpu_s: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Requests/s, latency percentiles (ms), errors and CPU ms per request by process."""
        done = len(self.latencies_s)
        per_request = {
            name: round(seconds * 1000 / done, 3) if done else None
            for name, seconds in self.cpu_s.items()
        }
        return {
            "concurrency": self.concurrency,
            "requests": done,
            "errors": self.errors,
            "requests_per_s": round(done / self.window_s, 1),
            "p50_ms": ms(percentile(self.latencies_s, 0.5)),
            "p99_ms": ms(percentile(self.latencies_s, 0.99)),
            "ttft_p50_ms": ms(percentile(self.first_tokens_s, 0.5)),
            "ttft_p99_ms": ms(percentile(self.first_tokens_s, 0.99)),
            "cpu_s": self.cpu_s,
            "cpu_ms_per_request": per_request,
        }


class _Window:
    """Whether requests finishing now are counted, and whether tasks should stop."""

    def __init__(self) -> None:
        self.recording = False
        self.stopping = False


Record: TypeAlias = Callable[[Outcome, float, float], None]
"""Told each request's outcome, start and end (``time.perf_counter``)."""


async def closed_loop(session: Session, running: Callable[[], bool], record: Record) -> None:
    """One client: sends its next request when the last returns, while ``running()``.

    A failed connection counts as a failed request, and the client opens a new one.
    """
    call, close = await session()
    try:
        while running():
            started = time.perf_counter()
            try:
                outcome = await call()
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                outcome = Outcome(ok=False)
                await close()
                call, close = await session()
            record(outcome, started, time.perf_counter())
    finally:
        await close()


async def _task_loop(session: Session, window: _Window, result: StepResult) -> None:
    def record(outcome: Outcome, started: float, ended: float) -> None:
        if not window.recording:
            return
        if not outcome.ok:
            result.errors += 1
            return
        result.latencies_s.append(ended - started)
        if outcome.first_token_at is not None:
            result.first_tokens_s.append(outcome.first_token_at - started)

    await closed_loop(session, lambda: not window.stopping, record)


async def run_step(
    session: Session, *, concurrency: int, duration_s: float, warmup_s: float, cpu: CpuMeter
) -> StepResult:
    """Run ``concurrency`` closed loops: warm up, then measure for ``duration_s``."""
    window = _Window()
    result = StepResult(concurrency=concurrency, window_s=duration_s)
    tasks = [asyncio.create_task(_task_loop(session, window, result)) for _ in range(concurrency)]
    await asyncio.sleep(warmup_s)
    cpu.start()
    window.recording = True
    started = time.perf_counter()
    await asyncio.sleep(duration_s)
    window.recording = False
    result.window_s = time.perf_counter() - started
    result.cpu_s = cpu.stop()
    window.stopping = True
    await asyncio.gather(*tasks)
    return result
