"""An engine's adapter table: which requests still ran on a version when it was removed."""

from __future__ import annotations

import asyncio

from lorafleet.worker.engines._adapter_table import AdapterTable

KEY = "pirate@0a1b2c3d4e5f"


def _table() -> AdapterTable[str]:
    table: AdapterTable[str] = AdapterTable()
    table.handles[KEY] = "pirate-handle"
    return table


async def test_cut_names_the_requests_still_running_and_marks_only_them() -> None:
    table, done = _table(), asyncio.Event()
    started = asyncio.Event()

    async def request(request_id: str) -> bool:
        async with table.tracked(KEY, request_id):
            started.set()
            await done.wait()
            return table.was_cut(request_id)

    running = asyncio.create_task(request("r1"))
    await started.wait()
    async with table.tracked(KEY, "r0"):
        pass  # ended before the removal: never cut
    assert table.running(KEY) == ["r1"]
    assert table.cut(KEY) == ["r1"]
    assert table.running(KEY) == [] and not table.was_cut("r0")
    done.set()
    assert await running is True
    assert not table.was_cut("r1")  # forgotten once it ended


async def test_a_request_on_a_version_added_again_is_not_cut() -> None:
    table = _table()
    assert table.cut(KEY) == []
    async with table.tracked(KEY, "r2"):
        assert not table.was_cut("r2")
        assert table.running(KEY) == ["r2"]
