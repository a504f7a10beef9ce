"""The vllm engine's adapter table: draining the requests that run on an adapter."""

from __future__ import annotations

import asyncio

from lorafleet.worker.engines._adapter_table import AdapterTable


def _table() -> AdapterTable[str]:
    table: AdapterTable[str] = AdapterTable()
    table.handles["pirate"] = "pirate-handle"
    return table


async def test_wait_idle_returns_once_the_running_requests_end() -> None:
    table, done = _table(), asyncio.Event()

    async def request() -> None:
        async with table.tracked("pirate", "r1"):
            await done.wait()

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    assert table.running("pirate") == ["r1"]
    waiter = asyncio.create_task(table.wait_idle("pirate", timeout_s=5))
    await asyncio.sleep(0)
    done.set()
    assert await waiter == []
    await task


async def test_wait_idle_gives_up_after_its_timeout_and_names_the_stragglers() -> None:
    table, never = _table(), asyncio.Event()

    async def request() -> None:
        async with table.tracked("pirate", "slow"):
            await never.wait()

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    assert await table.wait_idle("pirate", timeout_s=0.05) == ["slow"]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert table.running("pirate") == []
