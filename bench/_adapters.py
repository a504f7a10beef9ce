"""Adapter operations for ``bench.lora``: timed load/unload rounds, bulk loading, ``/v1/models``.

A change is timed from the instant of the worker call to the instant the
frontend's ``/v1/models`` shows it, polled on a keep-alive connection that
starts with the call.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Final

from bench._cluster import BenchCluster, Service
from bench._http import HttpConnection, build_request, http_once
from bench._report import ms, percentile

__all__ = ["FrontendModels", "Rounds", "admin", "models_latency", "populate", "run_rounds"]

PROBE: Final = "bench-probe"
VISIBLE_TIMEOUT_S: Final = 10.0
POPULATE_CONCURRENCY: Final = 16


@dataclass
class Rounds:
    """Per-round timings (seconds) of one scenario."""

    load_call_s: list[float] = field(default_factory=list)
    visible_s: list[float] = field(default_factory=list)
    unload_call_s: list[float] = field(default_factory=list)
    gone_s: list[float] = field(default_factory=list)
    errors: int = 0

    def summary(self) -> dict[str, Any]:
        """p50 and max in milliseconds of each timing, and the error count."""
        out: dict[str, Any] = {"rounds": len(self.visible_s), "errors": self.errors}
        for name in ("load_call_s", "visible_s", "unload_call_s", "gone_s"):
            values = getattr(self, name)
            key = name.removesuffix("_s")
            out[f"{key}_p50_ms"] = ms(percentile(values, 0.5))
            out[f"{key}_max_ms"] = ms(max(values, default=None))
        return out


class FrontendModels:
    """Keep-alive GETs of the frontend's ``/v1/models``."""

    def __init__(self, service: Service) -> None:
        self.port = service.port
        self.raw = build_request("GET", "127.0.0.1", service.port, "/v1/models")
        self.connection: HttpConnection | None = None

    async def models(self) -> bytes:
        """The body of ``GET /v1/models`` (reconnecting once if the server closed an idle one)."""
        if self.connection is not None:
            try:
                return (await self.connection.request(self.raw)).body
            except (OSError, asyncio.IncompleteReadError):
                await self.connection.close()
        self.connection = await HttpConnection.open("127.0.0.1", self.port)
        return (await self.connection.request(self.raw)).body

    async def wait_listed(self, name: str, listed: bool, since: float, poll_s: float) -> float:
        """Seconds from ``since`` until ``/v1/models`` lists ``name`` (or stops listing it)."""
        needle = f'"id":"{name}"'.encode()
        deadline = since + VISIBLE_TIMEOUT_S
        while ((needle in await self.models()) is not listed) and time.perf_counter() < deadline:
            await asyncio.sleep(poll_s)
        if time.perf_counter() >= deadline:
            raise TimeoutError(f"/v1/models did not {'list' if listed else 'drop'} {name!r}")
        return time.perf_counter() - since


async def admin(worker: Service, path: str, body: dict[str, Any]) -> int:
    """POST an engine update to a worker's status server; returns the HTTP status."""
    return (await http_once(worker.port, "POST", f"/engine/update/{path}", body)).status


async def _timed_change(
    frontend: FrontendModels, worker: Service, path: str, body: dict[str, Any], poll_s: float
) -> tuple[float, float]:
    """Call ``path`` and watch ``/v1/models`` from the same instant: (call s, visible s)."""
    listed = path == "load_lora"
    started = time.perf_counter()
    watch = asyncio.create_task(frontend.wait_listed(body["lora_name"], listed, started, poll_s))
    status = await admin(worker, path, body)
    call_s = time.perf_counter() - started
    if status != 200:
        watch.cancel()
        raise RuntimeError(f"{path} of {body['lora_name']!r} answered HTTP {status}")
    return call_s, await watch


async def run_rounds(
    frontend: FrontendModels, worker: Service, uri: str, rounds: int, poll_s: float
) -> Rounds:
    """Load and unload the probe adapter ``rounds`` times, after one untimed round."""
    result = Rounds()
    load = {"lora_name": PROBE, "source": {"uri": uri}}
    await admin(worker, "load_lora", load)
    await admin(worker, "unload_lora", {"lora_name": PROBE})
    for _ in range(rounds):
        try:
            call_s, visible_s = await _timed_change(frontend, worker, "load_lora", load, poll_s)
            result.load_call_s.append(call_s)
            result.visible_s.append(visible_s)
            unload = {"lora_name": PROBE}
            call_s, gone_s = await _timed_change(frontend, worker, "unload_lora", unload, poll_s)
            result.unload_call_s.append(call_s)
            result.gone_s.append(gone_s)
        except (RuntimeError, TimeoutError, OSError):
            result.errors += 1
            await admin(worker, "unload_lora", {"lora_name": PROBE})
    return result


async def populate(cluster: BenchCluster, workers: list[Service], total: int) -> float:
    """Load ``total`` adapters spread evenly over ``workers``; returns the seconds it took."""
    started = time.perf_counter()
    jobs = asyncio.Queue[tuple[Service, str]]()
    for index in range(total):
        jobs.put_nowait((workers[index % len(workers)], f"bench-{index:04d}"))

    async def loader() -> None:
        while not jobs.empty():
            worker, name = jobs.get_nowait()
            body = {"lora_name": name, "source": {"uri": cluster.adapter(name)}}
            status = await admin(worker, "load_lora", body)
            if status != 200:
                raise RuntimeError(f"load_lora of {name!r} answered HTTP {status}")

    await asyncio.gather(*(loader() for _ in range(POPULATE_CONCURRENCY)))
    return time.perf_counter() - started


async def models_latency(frontend: FrontendModels, samples: int) -> dict[str, Any]:
    """``GET /v1/models``: p50/p99 in ms, body size in bytes and entries."""
    durations = []
    body = b""
    for _ in range(samples):
        started = time.perf_counter()
        body = await frontend.models()
        durations.append(time.perf_counter() - started)
    return {
        "models_p50_ms": ms(percentile(durations, 0.5)),
        "models_p99_ms": ms(percentile(durations, 0.99)),
        "models_bytes": len(body),
        "models_entries": body.count(b'"object":"model"'),
    }
