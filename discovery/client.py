"""Connect to etcd and translate its client's exceptions into ours at the boundary."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Final
from urllib.parse import urlsplit

import aetcd
import grpc
from aetcd import rpc

from discovery.errors import EtcdUnavailableError

__all__ = ["ETCD_OP_TIMEOUT_S", "EtcdClient", "connect_etcd", "parse_endpoint"]

ETCD_OP_TIMEOUT_S: Final = 3
"""Every etcd call fails after this long, so an unreachable etcd never hangs a request."""

_DEADLINE_GRACE_S: Final = 1.0
"""Our own asyncio deadline runs this long after gRPC's: a call whose completion gRPC
never delivers (seen once in CI, with etcd just stopped) still ends, with a clear error."""

_DEFAULT_PORT: Final = 2379
_CHANNEL_OPTIONS: Final = {"grpc.use_local_subchannel_pool": 1}
"""Each client its own connections: gRPC otherwise shares them process-wide, and a new
client would inherit another's reconnect backoff and fail at once after an etcd restart."""


class EtcdClient(aetcd.Client):
    """An ``aetcd.Client`` that remembers its endpoint and bounds every call in time."""

    endpoint: str
    op_timeout_s: float

    @contextlib.asynccontextmanager
    async def errors(self, operation: str, key: str = "") -> AsyncIterator[None]:
        """Bound one etcd call in time and turn any failure into ``EtcdUnavailableError``."""
        deadline_s = self.op_timeout_s + _DEADLINE_GRACE_S
        try:
            async with asyncio.timeout(deadline_s):
                yield
        except TimeoutError as exc:
            raise EtcdUnavailableError(
                endpoint=self.endpoint,
                operation=operation,
                key=key,
                reason=f"no answer within {deadline_s:g} s",
            ) from exc
        except (aetcd.ClientError, grpc.RpcError, OSError) as exc:
            raise EtcdUnavailableError(
                endpoint=self.endpoint, operation=operation, key=key, reason=_reason(exc)
            ) from exc

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
                return reply.TTL
            return 0
        finally:
            call.cancel()


def parse_endpoint(endpoints: str) -> tuple[str, int]:
    """Return host and port of the first of comma-separated ``ETCD_ENDPOINTS`` URLs."""
    first = endpoints.split(",")[0].strip()
    parsed = urlsplit(first if "://" in first else f"http://{first}")
    if not parsed.hostname:
        raise ValueError(f"ETCD_ENDPOINTS {endpoints!r} names no host (e.g. http://127.0.0.1:2379)")
    return parsed.hostname, parsed.port or _DEFAULT_PORT


async def connect_etcd(endpoints: str, *, timeout_s: int = ETCD_OP_TIMEOUT_S) -> EtcdClient:
    """Connect to etcd and check it answers; raises ``EtcdUnavailableError`` otherwise."""
    host, port = parse_endpoint(endpoints)
    client = EtcdClient(host=host, port=port, timeout=timeout_s, options=_CHANNEL_OPTIONS)
    client.endpoint = f"{host}:{port}"
    client.op_timeout_s = timeout_s
    async with client.errors("connect"):
        await client.connect()
        await client.status()
    return client


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
