"""The batch group gate: one group runs at a time, groups take turns, nobody starves."""

from __future__ import annotations

import asyncio

from lorafleet.worker.engines._batch_groups import BatchGroupGate


async def _hold(gate: BatchGroupGate, group: str, log: list[str], release: asyncio.Event) -> None:
    async with gate.admit(group):
        log.append(f"in {group}")
        await release.wait()
    log.append(f"out {group}")


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_requests_of_one_group_run_together() -> None:
    gate, log, release = BatchGroupGate(), [], asyncio.Event()
    tasks = [asyncio.create_task(_hold(gate, "adapter", log, release)) for _ in range(3)]
    await _settle()
    assert log == ["in adapter"] * 3
    release.set()
    await asyncio.gather(*tasks)
    assert gate.running_group is None


async def test_other_group_waits_until_the_running_group_has_left() -> None:
    gate, log = BatchGroupGate(), []
    first, second = asyncio.Event(), asyncio.Event()
    base = asyncio.create_task(_hold(gate, "base", log, first))
    await _settle()
    adapter = asyncio.create_task(_hold(gate, "adapter", log, second))
    await _settle()
    assert log == ["in base"] and gate.waiting == 1
    first.set()
    await _settle()
    assert log == ["in base", "out base", "in adapter"]
    second.set()
    await asyncio.gather(base, adapter)


async def test_running_group_admits_no_newcomer_while_another_group_waits() -> None:
    gate, log = BatchGroupGate(), []
    base_release, adapter_release = asyncio.Event(), asyncio.Event()
    early_base = asyncio.create_task(_hold(gate, "base", log, base_release))
    await _settle()
    adapter = asyncio.create_task(_hold(gate, "adapter", log, adapter_release))
    await _settle()
    late_base = asyncio.create_task(_hold(gate, "base", log, base_release))
    await _settle()
    assert log == ["in base"] and gate.waiting == 2
    base_release.set()
    await _settle()
    assert log[:3] == ["in base", "out base", "in adapter"]
    adapter_release.set()
    await asyncio.gather(early_base, adapter, late_base)
    assert log[-2:] == ["in base", "out base"]


async def test_waiters_of_the_next_group_enter_together() -> None:
    gate, log = BatchGroupGate(), []
    base_release, adapter_release = asyncio.Event(), asyncio.Event()
    base = asyncio.create_task(_hold(gate, "base", log, base_release))
    await _settle()
    adapters = [asyncio.create_task(_hold(gate, "adapter", log, adapter_release)) for _ in range(3)]
    await _settle()
    base_release.set()
    await _settle()
    assert log.count("in adapter") == 3 and gate.running_group == "adapter"
    adapter_release.set()
    await asyncio.gather(base, *adapters)


async def test_cancelled_waiter_leaves_the_queue_and_blocks_nobody() -> None:
    gate, log = BatchGroupGate(), []
    base_release, never = asyncio.Event(), asyncio.Event()
    base = asyncio.create_task(_hold(gate, "base", log, base_release))
    await _settle()
    adapter = asyncio.create_task(_hold(gate, "adapter", log, never))
    await _settle()
    adapter.cancel()
    await asyncio.gather(adapter, return_exceptions=True)
    assert gate.waiting == 0
    late_base = asyncio.create_task(_hold(gate, "base", log, base_release))
    await _settle()
    assert log == ["in base", "in base"]
    base_release.set()
    await asyncio.gather(base, late_base)
    assert gate.running_group is None


async def test_waiter_cancelled_right_after_admission_gives_its_place_back() -> None:
    gate, log = BatchGroupGate(), []
    base_release = asyncio.Event()
    base = asyncio.create_task(_hold(gate, "base", log, base_release))
    await _settle()
    adapter = asyncio.create_task(_hold(gate, "adapter", log, asyncio.Event()))
    await _settle()
    base_release.set()
    await asyncio.sleep(0)  # base leaves and admits the adapter, which has not resumed yet
    adapter.cancel()
    await asyncio.gather(base, adapter, return_exceptions=True)
    assert gate.running_group is None and gate.waiting == 0
