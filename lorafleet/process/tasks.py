"""Ending background tasks for sure: a cancellation that a library swallows is repeated.

Python 3.11's ``asyncio.wait_for`` returns its inner call's result, dropping the
cancellation, when the two land in one turn of the loop (fixed in 3.12). Libraries built on
it then run on after ``task.cancel()``: nats-py's connect, and aetcd's watch creation, whose
reply can arrive with the cancel (a ``WatchCache`` closed just after etcd came back then
followed its watch forever, and its ``aclose`` never returned). Every close of a background
task goes through :func:`cancel_and_wait`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

__all__ = ["RECANCEL_S", "cancel_and_wait"]

RECANCEL_S: Final = 0.5
"""How long a cancelled task may take to end before it is cancelled again."""


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and return once every one has ended, cancelling again every
    ``RECANCEL_S`` those still running. Their exceptions are retrieved, not raised (as
    ``asyncio.gather(..., return_exceptions=True)``): a task being stopped has no one left
    to report to."""
    running = {task for task in tasks if not task.done()}
    while running:
        for task in running:
            task.cancel()
        _, running = await asyncio.wait(running, timeout=RECANCEL_S)
    for task in tasks:
        if not task.cancelled():
            task.exception()
