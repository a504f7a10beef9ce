"""A background task is stopped for sure, even when a library swallows its cancellation."""

from __future__ import annotations

import asyncio

from lorafleet.process.tasks import cancel_and_wait

STOP_TIMEOUT_S = 30.0
"""Far past the repeat interval: only a task that is never stopped reaches it."""


async def test_a_task_whose_wait_for_swallowed_the_cancel_is_still_stopped() -> None:
    """Python 3.11's ``asyncio.wait_for`` returns its inner call's result and drops the
    cancel when both land in one turn, as aetcd's watch creation did when a watch cache
    was closed as etcd came back: one cancel and a wait then never returned."""
    reply = asyncio.Event()

    async def follow_forever() -> None:
        await asyncio.wait_for(reply.wait(), 60)  # the watch's creation
        await asyncio.Event().wait()  # its events, none of which ever comes

    task = asyncio.create_task(follow_forever())
    await asyncio.sleep(0)  # the task waits for the reply
    reply.set()
    await asyncio.sleep(0)  # the reply lands: wait_for's inner call is done
    await asyncio.wait_for(cancel_and_wait(task), STOP_TIMEOUT_S)
    assert task.cancelled()


async def test_every_task_ends_and_their_errors_are_not_raised() -> None:
    async def fails() -> None:
        raise RuntimeError("a load that failed while the frontend stopped")

    async def waits() -> None:
        await asyncio.Event().wait()

    failed, waiting = asyncio.create_task(fails()), asyncio.create_task(waits())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(failed, waiting), STOP_TIMEOUT_S)
    assert failed.done() and isinstance(failed.exception(), RuntimeError)
    assert waiting.cancelled()
