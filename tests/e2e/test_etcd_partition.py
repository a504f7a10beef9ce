"""A frontend cut off from etcd while NATS and the workers are fine (issue 27, case 2).

Real frontend and worker processes on the test's etcd and NATS; a ``TcpProxy`` stands
between the frontend and etcd only. While the link is cut the fleet changes: one worker
leaves, another arrives. The frontend must keep serving from its last view and say so,
then see exactly the new fleet once the link returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.faults import TcpProxy
from tests.processes import ServiceProcess, start_frontend, start_worker

HEAL_TIMEOUT_S = 30


@pytest.fixture
async def etcd_proxy(etcd_url: str) -> AsyncIterator[TcpProxy]:
    proxy = await TcpProxy(int(etcd_url.rsplit(":", 1)[1])).start()
    yield proxy
    await proxy.aclose()


@pytest.fixture
def processes() -> Iterator[list[ServiceProcess]]:
    started: list[ServiceProcess] = []
    yield started
    for process in started:
        process.kill()


async def _until(check: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(HEAL_TIMEOUT_S):
        while not await check():
            await asyncio.sleep(0.05)


async def _models(client: httpx.AsyncClient) -> set[str]:
    return {model["id"] for model in (await client.get("/v1/models")).json()["data"]}


async def _in_sync_metric(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("lorafleet_frontend_etcd_in_sync")]
    return float(line.split()[-1])


async def _chat(client: httpx.AsyncClient, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return await client.post("/v1/chat/completions", json=body)


async def test_frontend_cut_from_etcd_serves_its_last_view_says_so_and_catches_up(
    tmp_path: Path, etcd_url: str, nats_url: str, namespace: str, etcd_proxy, processes
) -> None:
    where = {"etcd_url": etcd_url, "nats_url": nats_url, "namespace": namespace}

    async def worker(model: str) -> ServiceProcess:
        started = await asyncio.to_thread(start_worker, tmp_path, model=model, **where)
        processes.append(started)
        return started

    await worker("demo")
    leaving = await worker("leaving")
    frontend = await asyncio.to_thread(
        start_frontend, tmp_path, **{**where, "etcd_url": etcd_proxy.url}
    )  # started in a thread: the proxy lives on this event loop
    processes.append(frontend)
    async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as client:
        await _until(lambda: _has(client, {"demo", "leaving"}))
        assert (await client.get("/health")).json()["etcd"] == "in sync"

        etcd_proxy.cut()
        await _until(lambda: _health_is(client, "degraded"))
        health = await client.get("/health")
        assert health.status_code == 200 and "last view" in health.json()["etcd"]
        assert await _in_sync_metric(client) == 0
        await asyncio.to_thread(leaving.stop)  # the fleet changes behind the cut
        await worker("arriving")
        assert (await _chat(client, "demo")).status_code == 200  # served from the last view
        assert await _models(client) == {"demo", "leaving"}

        etcd_proxy.restore()
        await _until(lambda: _health_is(client, "healthy"))
        await _until(lambda: _has(client, {"demo", "arriving"}))
        assert await _in_sync_metric(client) == 1
        assert (await _chat(client, "arriving")).status_code == 200


async def _has(client: httpx.AsyncClient, models: set[str]) -> bool:
    return await _models(client) == models


async def _health_is(client: httpx.AsyncClient, status: str) -> bool:
    return (await client.get("/health")).json()["status"] == status
