"""Admission by priority while the fleet is saturated: the queue's order, shedding, giving up.

Pure asyncio bookkeeping, tested in-process; ``test_priority_shedding.py`` drives it through
real processes.
"""

from __future__ import annotations

import asyncio

import pytest

from lorafleet.frontend.admission import AdmissionSettings, FleetAdmission
from lorafleet.frontend.errors import FleetSaturatedError

LONG_WAIT_S = 60.0


def _admission(
    fleet_max_inflight: int, *, frontends: int = 1, wait_s: float = LONG_WAIT_S
) -> FleetAdmission:
    settings = AdmissionSettings(fleet_max_inflight=fleet_max_inflight, wait_s=wait_s)
    return FleetAdmission(settings, lambda: frontends)


async def _queued(admission: FleetAdmission, priority: int, tenant: str) -> asyncio.Task[None]:
    """A request that waits for a slot (its task, once it is in the queue)."""
    task = asyncio.create_task(admission.enter(priority, tenant))
    await asyncio.sleep(0)  # one turn of the loop: ``enter`` queues before it first awaits
    assert not task.done()
    return task


def test_each_frontend_runs_its_share_of_the_fleet_and_zero_means_no_limit() -> None:
    assert _admission(8, frontends=3).capacity == 2
    assert _admission(2, frontends=3).capacity == 1  # every frontend runs at least one
    assert _admission(0).capacity == 0


async def test_without_a_limit_nothing_is_counted_or_queued() -> None:
    admission = _admission(0)
    for _ in range(100):
        await admission.enter(0, "t")
    assert admission.inflight == 0 and admission.waiting == 0


async def test_requests_run_at_once_until_the_share_is_taken_then_wait() -> None:
    admission = _admission(2)
    await admission.enter(0, "a")
    await admission.enter(0, "a")
    third = await _queued(admission, 0, "a")

    assert admission.inflight == 2 and admission.waiting == 1 and not third.done()
    admission.leave()
    await third
    assert admission.inflight == 2 and admission.waiting == 0


async def test_a_freed_slot_goes_to_the_highest_priority_then_the_oldest() -> None:
    admission = _admission(3)
    for _ in range(3):
        await admission.enter(0, "low")
    early_low = await _queued(admission, 1, "low")
    high = await _queued(admission, 9, "high")
    late_low = await _queued(admission, 1, "low")

    admission.leave()
    await high
    assert not early_low.done() and not late_low.done()
    admission.leave()
    await early_low
    assert not late_low.done()
    admission.leave()
    await late_low


async def test_a_full_queue_sheds_its_lowest_priority_waiter_for_a_higher_one() -> None:
    admission = _admission(1)
    await admission.enter(0, "low")
    waiting_low = await _queued(admission, 0, "low")
    high = await _queued(admission, 5, "high")

    with pytest.raises(FleetSaturatedError, match="took its place") as shed:
        await waiting_low
    message = str(shed.value)
    assert "tenant 'low', priority 0" in message and "--fleet-max-inflight=1" in message
    assert not high.done() and admission.waiting == 1
    admission.leave()
    await high


async def test_a_full_queue_refuses_a_newcomer_of_no_higher_priority() -> None:
    admission = _admission(1)
    await admission.enter(9, "high")
    waiting_high = await _queued(admission, 9, "high")

    with pytest.raises(FleetSaturatedError, match="its priority or higher"):
        await admission.enter(9, "high")
    with pytest.raises(FleetSaturatedError, match="a request without a tenant, priority 0"):
        await admission.enter(0, "")
    assert not waiting_high.done() and admission.waiting == 1
    admission.leave()
    await waiting_high


async def test_a_request_that_waits_past_the_wait_bound_is_shed_and_leaves_the_queue() -> None:
    admission = _admission(1, wait_s=0.01)
    await admission.enter(0, "a")

    with pytest.raises(FleetSaturatedError, match=r"waited 0\.01 s for a slot"):
        await admission.enter(0, "a")
    assert admission.waiting == 0 and admission.inflight == 1


async def test_a_waiter_cancelled_as_its_slot_is_granted_passes_the_slot_on() -> None:
    admission = _admission(2)
    await admission.enter(0, "a")
    await admission.enter(0, "a")
    first = await _queued(admission, 0, "a")
    second = await _queued(admission, 0, "a")

    admission.leave()  # grants ``first``, which is cancelled before it runs again
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert admission.inflight == 2 and admission.waiting == 0


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    admission = _admission(1)
    await admission.enter(0, "a")
    waiter = await _queued(admission, 0, "a")

    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.waiting == 0 and admission.inflight == 1
    admission.leave()
    await admission.enter(0, "a")  # the slot is free again
    assert admission.inflight == 1
