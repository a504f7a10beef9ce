"""Admission by priority while the fleet is saturated: this frontend's share of the fleet's
request slots, a short queue served highest priority first, and shedding.

``--fleet-max-inflight`` says how many requests the whole fleet runs at once; each frontend
runs ``max(1, fleet_max_inflight // live frontends)`` of them. The fleet is saturated for
this frontend once that many run here. A request that finds it so waits, highest priority
first (its tenant's ``priority``, 0-9; a request without a tenant is 0), for at most
``--admission-wait-s``. The queue holds as many requests as may run: when a new one makes
it longer, the newest waiter of the lowest priority is shed (the new one itself, when
nothing waiting is below it). Shed requests get 429 with ``Retry-After``.

Pure asyncio bookkeeping, no I/O; ``frontend.generate_door`` calls ``enter`` and ``leave``.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from lorafleet.frontend.errors import FleetSaturatedError
from lorafleet.process.settings import NON_NEGATIVE, POSITIVE, Settings, setting

__all__ = ["AdmissionSettings", "FleetAdmission"]


@dataclass(frozen=True, kw_only=True)
class AdmissionSettings(Settings):
    """When the fleet counts as saturated, and how long a request may wait for a slot.

    Examples::

        AdmissionSettings()                                     # no limit: nothing queues
        AdmissionSettings(fleet_max_inflight=64)                # 64 over all frontends
        AdmissionSettings(fleet_max_inflight=64, wait_s=2.0)    # shed sooner
    """

    fleet_max_inflight: Annotated[int, NON_NEGATIVE] = setting(
        0, flag="--fleet-max-inflight", env="DYN_FLEET_MAX_INFLIGHT",
        help="requests the whole fleet runs at once (its workers' batch slots), shared by the "
        "live frontends; past that requests queue and the lowest tenant priority is shed "
        "first (429); 0: no limit",
    )  # fmt: skip
    wait_s: Annotated[float, POSITIVE] = setting(
        10.0, flag="--admission-wait-s", env="DYN_ADMISSION_WAIT_S",
        help="seconds a request may wait for a slot while the fleet is saturated; then 429",
    )  # fmt: skip


@dataclass(order=True)
class _Waiter:
    """One queued request; ordered highest priority first, then by arrival."""

    rank: int
    """Minus the priority, so that the list's front is the highest."""
    arrival: int
    tenant: str = field(compare=False)
    granted: asyncio.Future[None] = field(compare=False)

    @property
    def priority(self) -> int:
        return -self.rank


class FleetAdmission:
    """Counts the requests running through this frontend; queues and sheds past its share."""

    def __init__(self, settings: AdmissionSettings, share: Callable[[], int]) -> None:
        """``share``: how many live frontends divide the fleet's slots (this one included)."""
        self._settings = settings
        self._share = share
        self.limited = bool(settings.fleet_max_inflight)
        """False when the fleet has no limit: ``enter`` and ``leave`` then do nothing."""
        self.inflight = 0
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()

    @property
    def capacity(self) -> int:
        """Requests this frontend runs at once (0: no limit)."""
        fleet = self._settings.fleet_max_inflight
        return max(1, fleet // max(1, self._share())) if fleet else 0

    @property
    def waiting(self) -> int:
        """Requests queued for a slot now."""
        return len(self._waiting)

    async def enter(self, priority: int, tenant: str) -> None:
        """Take a slot, waiting for one while the fleet is saturated; ``FleetSaturatedError``
        when this request is shed. Every ``enter`` that returns is paired with ``leave``."""
        if not self.limited:
            return
        granted = asyncio.get_running_loop().create_future()
        waiter = _Waiter(-priority, next(self._arrivals), tenant, granted)
        bisect.insort(self._waiting, waiter)
        self._hand_over()
        self._shed_overflow(waiter)
        if not waiter.granted.done():
            await self._wait(waiter)
        waiter.granted.result()  # raises FleetSaturatedError when it was shed

    def leave(self) -> None:
        """A request that entered ended: its slot goes to the first waiter."""
        if not self.limited:
            return
        self.inflight -= 1
        self._hand_over()

    async def _wait(self, waiter: _Waiter) -> None:
        """Wait for ``waiter``'s slot, at most ``wait_s``; a request that gives up (timed
        out, cancelled) leaves the queue, or passes on a slot granted meanwhile."""
        try:
            async with asyncio.timeout(self._settings.wait_s):
                # shielded: a cancelled wait must not cancel the future ``_hand_over`` sets
                await asyncio.shield(waiter.granted)
        except TimeoutError:
            self._give_up(waiter)
            why = f"it waited {self._settings.wait_s:g} s for a slot"
            raise self._saturated(waiter, why) from None
        except asyncio.CancelledError:
            self._give_up(waiter)
            raise

    def _give_up(self, waiter: _Waiter) -> None:
        if waiter in self._waiting:
            self._waiting.remove(waiter)
            waiter.granted.cancel()
        elif waiter.granted.exception() is None:
            self.leave()  # granted as it gave up: the slot goes on to the next

    def _hand_over(self) -> None:
        """Give free slots to the waiters at the front of the queue."""
        while self._waiting and self.inflight < self.capacity:
            self._waiting.pop(0).granted.set_result(None)
            self.inflight += 1

    def _shed_overflow(self, arrived: _Waiter) -> None:
        """Shed the newest, lowest-priority waiters while more wait than may run."""
        while len(self._waiting) > self.capacity:
            shed = self._waiting.pop()
            why = (
                "every place in the queue for a slot is held by a request of its priority or higher"
                if shed is arrived
                else f"a request of priority {arrived.priority} took its place in the queue"
            )
            shed.granted.set_exception(self._saturated(shed, why))

    def _saturated(self, waiter: _Waiter, why: str) -> FleetSaturatedError:
        return FleetSaturatedError(
            waiter.tenant, waiter.priority, self.capacity, self._settings.fleet_max_inflight, why
        )
