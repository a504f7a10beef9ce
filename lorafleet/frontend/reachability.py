"""Instances this frontend lost over NATS, kept out of routing until one of their pings answers.

An attempt is lost when nobody subscribes its instance's subject, or when the instance is
silent and misses a ping (``request_plane.Reply.receive``). The instance may be dead, or
alive behind a NATS route that is cut or stalled (a split cluster): its cards stay in
etcd either way. Let back on a timer, it got a request every few seconds, and while a
route was stalled each of those waited a stall and a ping (``stall_s`` + ``ping_timeout_s``)
before going elsewhere. So from the loss on, a background task pings the instance every
``PROBE_INTERVAL_S``; it returns to routing once ``quarantine_s`` has passed and a ping
was answered. After ``PROBE_LIMIT_S`` without an answer the probing stops and the
instance is let back (a request tries it, and loses it again if it is still cut off), so
an instance that left etcd is not probed for ever.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

import structlog

from lorafleet.frontend.errors import InstanceLostError
from lorafleet.frontend.request_plane import RequestPlane
from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.discovery import Instance

__all__ = ["PROBE_INTERVAL_S", "PROBE_LIMIT_S", "Unreachable"]

log = structlog.get_logger(__name__)

PROBE_INTERVAL_S: Final = 0.5
"""Pause between two pings of a lost instance (a ping that times out takes longer)."""
PROBE_LIMIT_S: Final = 60.0
"""How long a lost instance is probed before a request may try it again anyway."""


class ProbeSettings(Protocol):
    """What probing reads of ``DispatchSettings``."""

    @property
    def ping_timeout_s(self) -> float:
        """How long the instance has to answer a ping."""

    @property
    def quarantine_s(self) -> float:
        """The least time a lost instance stays out of routing."""


@dataclass(slots=True)
class _Lost:
    """One lost instance: why, since when, and whether a ping has answered since."""

    error: InstanceLostError
    since: float
    task: asyncio.Task[None] | None = None
    answered: bool = False
    unanswered_pings: int = 0


class Unreachable:
    """The instances to keep out of routing, and the probes that let them back."""

    def __init__(
        self,
        plane: RequestPlane,
        settings: ProbeSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._plane = plane
        self._settings = settings
        self._clock = clock
        self._lost: dict[int, _Lost] = {}

    def __len__(self) -> int:
        return len(self._lost)

    def lose(self, instance: Instance, error: InstanceLostError) -> None:
        """``instance`` was lost (``error`` says how): keep it out until a ping answers."""
        instance_id = instance.instance_id
        lost = self._lost.get(instance_id)
        if lost is not None and not lost.answered:
            return  # already probed
        if lost is not None and lost.task is not None:
            lost.task.cancel()
        lost = self._lost[instance_id] = _Lost(error, self._clock())
        probe = self._probe(instance, lost)  # a context of its own: not the request's ids
        lost.task = asyncio.get_running_loop().create_task(probe, context=contextvars.Context())
        log.warning("instance unreachable", instance=f"{instance_id:x}", reason=error.reason)

    def avoided(self) -> set[int]:
        """The instances to keep out now; forgets those that are back."""
        now = self._clock()
        back = [
            iid
            for iid, lost in self._lost.items()
            if lost.answered and now - lost.since >= self._settings.quarantine_s
        ]
        for instance_id in back:
            del self._lost[instance_id]
        return set(self._lost)

    def stalled(self, instance: Instance) -> InstanceLostError | None:
        """Why ``instance`` is not worth a try, if it stalled and a probe's ping went
        unanswered since: a try would wait a stall and a ping for nothing. (One missed ping
        of a busy worker is not enough: until a probe misses one too, requests try it.)"""
        lost = self._lost.get(instance.instance_id)
        if lost is None or lost.answered or not lost.error.stalled or not lost.unanswered_pings:
            return None
        since_s = self._clock() - lost.since
        reason = (
            f"unreachable from this frontend for {since_s:.1f} s ({lost.error.reason}); "
            f"it is pinged every {PROBE_INTERVAL_S} s and routed to again once it answers"
        )
        return InstanceLostError(instance.instance_id, reason, stalled=True)

    def count(self) -> int:
        """How many instances are kept out and have not answered a ping since."""
        return sum(not lost.answered for lost in self._lost.values())

    def reasons(self) -> dict[str, str]:
        """Each instance kept out (hex id) and why: for ``/health``."""
        return {f"{iid:x}": _why(lost) for iid, lost in self._lost.items() if not lost.answered}

    async def aclose(self) -> None:
        """Stop every probe."""
        await cancel_and_wait(*(lost.task for lost in self._lost.values() if lost.task is not None))
        self._lost.clear()

    async def _probe(self, instance: Instance, lost: _Lost) -> None:
        instance_id = instance.instance_id
        while self._lost.get(instance_id) is lost:
            if await self._plane.ping(instance.subject, self._settings.ping_timeout_s):
                lost.answered = True
                log.info("instance reachable again", instance=f"{instance_id:x}",
                         after_s=round(self._clock() - lost.since, 3))  # fmt: skip
                return
            lost.unanswered_pings += 1
            if self._clock() - lost.since >= PROBE_LIMIT_S:
                del self._lost[instance_id]
                log.warning("instance still unreachable; letting requests try it",
                            instance=f"{instance_id:x}", after_s=PROBE_LIMIT_S)  # fmt: skip
                return
            await asyncio.sleep(PROBE_INTERVAL_S)


def _why(lost: _Lost) -> str:
    pings = f"; {lost.unanswered_pings} pings unanswered since" if lost.unanswered_pings else ""
    return f"{lost.error.reason}{pings}"
