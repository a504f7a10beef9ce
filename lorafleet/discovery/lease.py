"""One etcd lease per process, kept alive, and the records bound to it.

The keeper owns every record the process published. Whenever the lease is
lost (etcd restarted and it expired, keep-alive failed too long) it grants
the same lease id again and puts every record back; after any etcd error it
reconciles etcd with what it owns. Callers never repair anything themselves.

While etcd cannot be reached the keeper counts down the lease from the last renewal
etcd confirmed: once that runs out the state is ``EXPIRED`` (etcd has dropped, or is
about to drop, every record), and callers such as ``/health`` can say the process is
no longer published. The first renewal after the heal re-grants and puts everything back.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from typing import Final

import aetcd
import structlog

from lorafleet.discovery.client import EtcdClient
from lorafleet.process.backoff import backoff_s
from lorafleet.process.tasks import cancel_and_wait

__all__ = ["LeaseKeeper", "LeaseState"]

log = structlog.get_logger(__name__)

MAX_BACKOFF_S: Final = 0.5
"""Retry a failed keep-alive at least this often: with the channel's reconnect backoff
(``MAX_RECONNECT_BACKOFF_MS``) the lease is kept within about 1 s of etcd's return."""


class LeaseState(enum.Enum):
    """Where the keeper stands; changed only by ``_set_state``."""

    ACTIVE = "active"
    RECOVERING = "recovering"
    """Keep-alives fail, but the last confirmed renewal still holds: nothing is lost yet."""
    EXPIRED = "expired"
    """Keep-alives failed for a whole TTL since the last renewal: the records are gone."""
    CLOSED = "closed"


class LeaseKeeper:
    """Grants a lease, keeps it alive in ``_keepalive_loop`` and re-puts its records if lost."""

    def __init__(self, etcd: EtcdClient, lease_id: int, ttl_s: int) -> None:
        self._etcd = etcd
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        self.state = LeaseState.ACTIVE
        self._records: dict[str, bytes] = {}
        self._lock = asyncio.Lock()
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None

    @classmethod
    async def grant(cls, etcd: EtcdClient, ttl_s: int) -> LeaseKeeper:
        """Grant a new lease of ``ttl_s`` seconds and start keeping it alive."""
        sent_at = asyncio.get_running_loop().time()
        with etcd.errors("grant lease"):
            lease = await etcd.lease(ttl_s)
        keeper = cls(etcd, lease.id, ttl_s)
        keeper._renewed(sent_at, ttl_s)
        keeper._task = asyncio.create_task(keeper._keepalive_loop(), name="lease-keepalive")
        log.info("lease granted", lease=f"{lease.id:x}", ttl_s=ttl_s)
        return keeper

    async def __aenter__(self) -> LeaseKeeper:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def expired(self) -> bool:
        """Whether etcd no longer holds this process's records (the lease ran out unrenewed)."""
        return self.state is LeaseState.EXPIRED

    @property
    def records(self) -> dict[str, bytes]:
        """A copy of the records this process owns, by key."""
        return dict(self._records)

    async def put(self, key: str, value: bytes) -> None:
        """Put ``key`` bound to the lease; raises ``EtcdUnavailableError`` if etcd fails."""
        async with self._lock:
            try:
                with self._etcd.errors("put", key):
                    await self._etcd.put(key.encode(), value, lease=self.lease_id)
            except Exception:
                self._dirty = True  # the put may have landed: reconcile removes it
                raise
            self._records[key] = value

    async def delete(self, key: str) -> None:
        """Delete ``key``; on failure the record stays owned (and is put back if missing)."""
        async with self._lock:
            try:
                with self._etcd.errors("delete", key):
                    await self._etcd.delete(key.encode())
            except Exception:
                self._dirty = True
                raise
            self._records.pop(key, None)

    async def aclose(self, *, revoke: bool = True) -> None:
        """Stop keeping the lease alive and, when ``revoke``, delete every record at once."""
        if self.state is LeaseState.CLOSED:
            return
        self._set_state(LeaseState.CLOSED)
        if self._expiry is not None:
            self._expiry.cancel()
        if self._task is not None:
            await cancel_and_wait(self._task)
        if revoke:
            try:
                with self._etcd.errors("revoke lease"):
                    await self._etcd.revoke_lease(self.lease_id)
            except Exception as exc:
                log.warning("lease revoke failed; records expire with the TTL", error=str(exc))

    def _set_state(self, state: LeaseState) -> None:
        if state is not self.state:
            log.info("lease state", lease=f"{self.lease_id:x}", state=state.value)
            self.state = state

    async def _keepalive_loop(self) -> None:
        interval_s = max(self.ttl_s / 3, 0.2)
        failures = 0
        while True:
            try:
                await self._keepalive_once()
                failures = 0
                self._set_state(LeaseState.ACTIVE)
                await asyncio.sleep(interval_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self._dirty = True
                # one warning when the trouble starts; ``_set_state`` logs the recovery
                report = log.warning if self.state is LeaseState.ACTIVE else log.debug
                report("lease keep-alive failed", lease=f"{self.lease_id:x}", error=str(exc))
                if self.state is LeaseState.ACTIVE:
                    self._set_state(LeaseState.RECOVERING)
                await asyncio.sleep(backoff_s(failures, cap_s=min(MAX_BACKOFF_S, interval_s)))

    def _renewed(self, sent_at: float, ttl_s: int) -> None:
        """etcd confirmed the lease at a request sent at ``sent_at`` (loop time): it holds
        at least ``ttl_s`` from then, so the count-down to ``EXPIRED`` restarts there."""
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = asyncio.get_running_loop().call_at(sent_at + ttl_s, self._expire)

    def _expire(self) -> None:
        if self.state is LeaseState.CLOSED:
            return
        log.warning("lease expired unrenewed: etcd has dropped this process's records",
                    lease=f"{self.lease_id:x}", records=len(self._records))  # fmt: skip
        self._set_state(LeaseState.EXPIRED)

    async def _keepalive_once(self) -> None:
        sent_at = asyncio.get_running_loop().time()
        with self._etcd.errors("keep lease alive"):
            ttl_s = await self._etcd.keep_lease_alive(self.lease_id)
        if ttl_s <= 0:
            sent_at = asyncio.get_running_loop().time()
            await self._regrant()
            ttl_s = self.ttl_s
        elif self._dirty:
            await self._reconcile()
        self._renewed(sent_at, ttl_s)

    async def _regrant(self) -> None:
        """Grant the same lease id again and put every owned record back."""
        async with self._lock:
            # DuplicateLeaseError: it exists again already; the puts bind to it.
            with (
                self._etcd.errors("re-grant lease"),
                contextlib.suppress(aetcd.exceptions.DuplicateLeaseError),
            ):
                await self._etcd.lease(self.ttl_s, lease_id=self.lease_id)
            for key, value in self._records.items():
                with self._etcd.errors("put back", key):
                    await self._etcd.put(key.encode(), value, lease=self.lease_id)
            self._dirty = False
        log.warning("lease re-granted", lease=f"{self.lease_id:x}", records=len(self._records))

    async def _reconcile(self) -> None:
        """Make etcd hold exactly the owned records under the lease."""
        async with self._lock:
            with self._etcd.errors("list lease records"):
                info = await self._etcd.get_lease_info(self.lease_id, keys=True)
            in_etcd = {key.decode() for key in info.keys}
            for key in in_etcd - self._records.keys():
                with self._etcd.errors("delete stray record", key):
                    await self._etcd.delete(key.encode())
            for key in self._records.keys() - in_etcd:
                with self._etcd.errors("put back", key):
                    await self._etcd.put(key.encode(), self._records[key], lease=self.lease_id)
            self._dirty = False
