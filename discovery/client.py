"""Connect to etcd and translate its client's exceptions into ours at the boundary."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Final
from urllib.parse import urlsplit

import aetcd
import grpc
from aetcd import rpc

from discovery.errors import EtcdUnavailableError

__all__ = ["ETCD_OP_TIMEOUT_S", "EtcdClient", "connect_etcd", "parse_endpoint"]

ETCD_OP_TIMEOUT_S: Final = 3
"""Every etcd call fails after this long, so an unreachable etcd never hangs a request."""

_DEFAULT_PORT: Final = 2379
_CHANNEL_OPTIONS: Final = {"grpc.use_local_subchannel_pool": 1}
"""Each client its own connections: gRPC otherwise shares them process-wide, and a new
client would inherit another's reconnect backoff and fail at once after an etcd restart."""


class EtcdClient(aetcd.Client):
    """An ``aetcd.Client`` that remembers its endpoint for error messages."""

    endpoint: str

    @contextlib.contextmanager
    def errors(self, operation: str, key: str = "") -> Iterator[None]:
        """Turn any etcd client failure inside the block into ``EtcdUnavailableError``.

        A task cancelled during the call stays cancelled: gRPC sometimes reports a call
        cancelled under it as failed (UNAVAILABLE while etcd is down), and a retry loop
        that took that for an etcd error never ended (CI hung in ``LeaseKeeper.aclose``).
        """
        task = asyncio.current_task()
        cancels_before = task.cancelling() if task is not None else 0
        try:
            yield
        except (TimeoutError, aetcd.ClientError, grpc.RpcError, OSError) as exc:
            if task is not None and task.cancelling() > cancels_before:
                raise asyncio.CancelledError from exc
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
    with client.errors("connect"):
        await client.connect()
        await client.status()
    return client


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
