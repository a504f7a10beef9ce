"""Connect to etcd and translate its client's exceptions into ours at the boundary.

The channel is ours, not aetcd's: it spans every ``ETCD_ENDPOINTS`` member, speaks TLS
for ``https://``, carries an auth token that is renewed when etcd forgets it, and
reconnects within half a second of etcd's return however long it was gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Iterator
from typing import Final

import aetcd
import grpc
import structlog
from aetcd import rpc, utils, watcher

from lorafleet.discovery._auth import TokenInterceptor, is_stale_token
from lorafleet.discovery._channel import (
    MAX_RECONNECT_BACKOFF_MS,
    ChannelPlan,
    Resolver,
    needs_resolving,
    open_channel,
    plan_channel,
    resolve_host,
)
from lorafleet.discovery.errors import EtcdRefusedError, EtcdUnavailableError
from lorafleet.discovery.keys import INSTANCES_ROOT, KEYS_ROOT
from lorafleet.discovery.settings import EtcdSettings

__all__ = [
    "ETCD_OP_TIMEOUT_S",
    "EtcdClient",
    "MAX_RECONNECT_BACKOFF_MS",
    "RERESOLVE_INTERVAL_S",
    "connect_etcd",
]

log = structlog.get_logger(__name__)

ETCD_OP_TIMEOUT_S: Final = 3
"""Every etcd call fails after this long, so an unreachable etcd never hangs a request."""

RERESOLVE_INTERVAL_S: Final = 2.0
"""While no member answers, look their names up again at most this often: a member that
moved (a new pod, a new container) has a new address under its old name."""

MAX_RETIRED_CHANNELS: Final = 2
"""Channels left behind by a re-open are closed once this many newer ones exist: calls
on them have long timed out, and a watch still there starts again on the new one."""

_CREDENTIALS_HINT: Final = "ETCD_AUTH_USERNAME and ETCD_AUTH_PASSWORD"
_TLS_HINT: Final = (
    "ETCD_AUTH_CA (the CA that signed etcd's certificate), ETCD_AUTH_CLIENT_CERT and "
    "ETCD_AUTH_CLIENT_KEY"
)
_ROLE_HINT: Final = f"the etcd role of ETCD_AUTH_USERNAME (it needs readwrite on {KEYS_ROOT})"
_TLS_MARKERS: Final = ("ssl", "tls", "handshake", "certificate")
_TRANSIENT_TLS_TEXT: Final = "endpoint closing"
"""A handshake cut off by a closing socket (a loaded or starting etcd): worth retrying."""
_STALE_TOKEN_TEXT: Final = "invalid auth token"
_NO_MEMBER_TEXT: Final = "failed to connect to all addresses"
_NO_LEADER_TEXT: Final = "no leader"
REQUIRE_LEADER: Final = (("hasleader", "true"),)
"""Sent with every watch (etcd's ``WithRequireLeader``): a member cut off from the others
(in the minority of a partition) ends the watch with "no leader" within about three
election timeouts, rather than keep it open with no events while it still answers pings."""
_OPENSSL_REASON: Final = re.compile(r"OPENSSL_internal:(.+?)(?:: OK)?$")


class EtcdClient(aetcd.Client):  # type: ignore[misc]  # aetcd ships no types: its Client is Any
    """An ``aetcd.Client`` on our channel (members, TLS, token); errors name its endpoints."""

    channel: grpc.aio.Channel
    _watcher: watcher.Watcher

    def __init__(
        self, settings: EtcdSettings, *, timeout_s: int = ETCD_OP_TIMEOUT_S,
        resolve: Resolver = resolve_host,
    ) -> None:  # fmt: skip
        super().__init__(timeout=timeout_s)
        self.settings = settings
        self.endpoint = settings.describe()
        self._tokens = (
            TokenInterceptor(settings.username, settings.password, timeout_s)
            if settings.username is not None and settings.password is not None
            else None
        )
        self._resolve = resolve
        self._plan: ChannelPlan | None = None
        self._no_member_answers = False
        self._first_member = 0
        self._member_stalled = False
        self._resolved_at_s = 0.0
        self._connect_lock = asyncio.Lock()
        self._retired: list[tuple[grpc.aio.Channel, watcher.Watcher]] = []

    async def connect(self) -> None:
        """Open the channel and its stubs; a new channel when the members' names moved.

        No I/O but a DNS lookup: gRPC connects on the first call.
        """
        if self._connected.is_set() and not self._reopen_due():
            return
        async with self._connect_lock:
            if self._connected.is_set() and not self._reopen_due():
                return
            if self._member_stalled:
                self._member_stalled = False
                self._first_member += 1
            self._no_member_answers = False
            self._resolved_at_s = time.monotonic()
            plan = await asyncio.to_thread(
                plan_channel, self.settings, self._resolve, first=self._first_member
            )
            if plan != self._plan:
                self._open(plan)
            while len(self._retired) > MAX_RETIRED_CHANNELS:
                await self._close_channel(*self._retired.pop(0))

    def _reopen_due(self) -> bool:
        return self._member_stalled or self._resolve_due()

    def _resolve_due(self) -> bool:
        return (
            self._no_member_answers
            and needs_resolving(self.settings)
            and time.monotonic() - self._resolved_at_s >= RERESOLVE_INTERVAL_S
        )

    def _open(self, plan: ChannelPlan) -> None:
        if self._plan is not None:  # calls still on the old channel fail and are retried
            self._retired.append((self.channel, self._watcher))
            log.info("etcd channel re-opened (members moved or one stalled)",
                     endpoints=self.endpoint, to=plan.target)  # fmt: skip
        self._plan = plan
        self.channel = open_channel(self.settings, plan, self._tokens)
        if self._tokens is not None:
            self._tokens.bind(self.channel)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(
            rpc.WatchStub(self.channel), timeout=self._timeout, metadata=REQUIRE_LEADER
        )
        self._connected.set()

    async def close(self) -> None:
        """Close the channel, and any channel left behind when the members moved."""
        for channel, old_watcher in self._retired:
            await self._close_channel(channel, old_watcher)
        self._retired.clear()
        await super().close()

    @staticmethod
    async def _close_channel(channel: grpc.aio.Channel, old_watcher: watcher.Watcher) -> None:
        await old_watcher.shutdown()
        await channel.close()

    async def authenticate(self) -> None:
        """Fetch an auth token now (when a user is configured), so bad credentials show at once."""
        await self.connect()
        if self._tokens is not None:
            await self._tokens.token()

    @contextlib.contextmanager
    def errors(self, operation: str, key: str = "") -> Iterator[None]:
        """Turn any etcd client failure inside the block into ``EtcdUnavailableError``.

        Refusals (password, role, certificate) become the permanent ``EtcdRefusedError``.
        A task cancelled during the call stays cancelled: gRPC sometimes reports a call
        cancelled under it as failed (UNAVAILABLE while etcd is down), and a retry loop
        that took that for an etcd error never ended (CI hung in ``LeaseKeeper.aclose``).
        The other way round, a call whose channel was closed under it (a re-open retired
        it) raises ``CancelledError`` in a task nobody cancelled: that is a failed call.
        Let through, it ended the lease keeper's and the watches' loops for good, and a
        worker parted from etcd's majority never published itself again (issue 27).
        """
        task = asyncio.current_task()
        cancels_before = task.cancelling() if task is not None else 0
        try:
            yield
        except (TimeoutError, aetcd.ClientError, grpc.RpcError, OSError) as exc:
            if task is not None and task.cancelling() > cancels_before:
                raise asyncio.CancelledError from exc
            raise self._translate(exc, operation, key) from exc
        except asyncio.CancelledError as exc:
            if task is None or task.cancelling() > cancels_before:
                raise
            raise self._translate(exc, operation, key) from exc

    def _translate(self, exc: BaseException, operation: str, key: str) -> EtcdUnavailableError:
        code, reason = _status(exc)
        check = self._refusal_hint(code, reason.lower())
        if check is not None:
            return EtcdRefusedError(
                endpoint=self.endpoint, operation=operation, reason=reason, check=check
            )
        if self._tokens is not None and is_stale_token(exc.__cause__ or exc):
            self._tokens.forget()  # etcd restarted or the token idled out: log in again
        if _NO_MEMBER_TEXT in reason:
            self._no_member_answers = True  # the next call may look the names up again
        if len(self.settings.endpoints) > 1 and (
            code is grpc.StatusCode.DEADLINE_EXCEEDED or _NO_LEADER_TEXT in reason
        ):
            # The member in use may be stalled or cut off from the others (it still
            # accepts connections, so gRPC stays with it): the next call starts from the
            # next member.
            self._member_stalled = True
        return EtcdUnavailableError(
            endpoint=self.endpoint, operation=operation, key=key, reason=reason
        )

    def _refusal_hint(self, code: grpc.StatusCode | None, reason: str) -> str | None:
        """Which variables to check when etcd refused us for good, else None."""
        if _STALE_TOKEN_TEXT in reason:
            return None
        if "authentication failed" in reason or "user name is empty" in reason:
            return _CREDENTIALS_HINT
        if code is grpc.StatusCode.PERMISSION_DENIED or "permission denied" in reason:
            return _ROLE_HINT
        if _TRANSIENT_TLS_TEXT in reason:
            return None
        if self.settings.tls and any(marker in reason for marker in _TLS_MARKERS):
            return _TLS_HINT
        return None

    async def list_page(
        self, prefix: bytes, start: bytes, *, limit: int, revision: int = 0
    ) -> rpc.RangeResponse:
        """Up to ``limit`` keys under ``prefix`` from ``start`` on, in key order, as they were
        at ``revision`` (0: now); ``more`` says whether keys are left after the last one.

        ``aetcd.Client.get_prefix`` sends neither limit nor revision, so a big prefix
        comes back as one message, which gRPC refuses past 4 MiB (about 7,000 cards).
        """
        await self.connect()
        request = rpc.RangeRequest(
            key=start, range_end=utils.prefix_range_end(prefix), limit=limit, revision=revision
        )
        return await self.kvstub.Range(request, timeout=self._timeout, metadata=self.metadata)

    async def newest_revision(self, prefix: bytes) -> int:
        """The highest ``mod_revision`` among the keys under ``prefix`` now (0: no key).

        A watch that applied events up to it holds every key there is: the frontend's
        read-your-writes check before a 404. Keys only, one key back.
        """
        await self.connect()
        request = rpc.RangeRequest(
            key=prefix, range_end=utils.prefix_range_end(prefix), limit=1, keys_only=True,
            sort_order=rpc.RangeRequest.DESCEND, sort_target=rpc.RangeRequest.MOD,
        )  # fmt: skip
        reply = await self.kvstub.Range(request, timeout=self._timeout, metadata=self.metadata)
        return int(reply.kvs[0].mod_revision) if reply.kvs else 0

    async def keep_lease_alive(self, lease_id: int) -> int:
        """Refresh the lease once and return the TTL etcd gave it (<= 0: the lease is gone).

        ``aetcd.Client.refresh_lease`` leaves its keep-alive stream open until the
        deadline after the first reply; this one closes it at once.
        """
        await self.connect()
        call = self.leasestub.LeaseKeepAlive(
            [rpc.LeaseKeepAliveRequest(ID=lease_id)],
            timeout=self._timeout,
            metadata=self.metadata,
        )
        try:
            async for reply in call:
                return int(reply.TTL)
            return 0
        finally:
            call.cancel()


async def connect_etcd(
    settings: EtcdSettings | str, *, timeout_s: int = ETCD_OP_TIMEOUT_S,
    resolve: Resolver = resolve_host,
) -> EtcdClient:  # fmt: skip
    """Connect once and check etcd answers and lets us read; raises ``EtcdUnavailableError``.

    One attempt, no retry: callers that want to wait for etcd loop around it and stop
    on ``EtcdRefusedError`` (``permanent``). A plain string is ``ETCD_ENDPOINTS`` alone.
    """
    if isinstance(settings, str):
        settings = EtcdSettings.from_endpoints(settings)
    client = EtcdClient(settings, timeout_s=timeout_s, resolve=resolve)
    try:
        with client.errors("connect"):
            await client.authenticate()
            await client.status()
            await client.get(INSTANCES_ROOT.encode())  # needs the read permission auth grants
    except BaseException:
        await client.close()
        raise
    return client


def _status(exc: BaseException) -> tuple[grpc.StatusCode | None, str]:
    """The gRPC status code (when there is one) and a one-line reason."""
    if isinstance(exc, asyncio.CancelledError):
        return None, "call cancelled: its channel was closed (the client moved to another member)"
    rpc_error = next((e for e in (exc, exc.__cause__) if isinstance(e, grpc.aio.AioRpcError)), None)
    if rpc_error is not None:
        return rpc_error.code(), _one_line(rpc_error.details() or rpc_error.code().name)
    return None, _one_line(str(exc) or type(exc).__name__)


def _one_line(text: str) -> str:
    """The first line, with a TLS failure cut to what OpenSSL said (gRPC wraps it thrice)."""
    first = text.splitlines()[0] if text else ""
    openssl = _OPENSSL_REASON.search(first)
    if openssl is not None and "handshake" in first.lower():
        return f"TLS handshake failed: {openssl.group(1)}"
    return first[:300]
