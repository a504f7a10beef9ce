"""The etcd client's boundary: what a call that ends badly raises."""

from __future__ import annotations

import asyncio

import pytest

from lorafleet.discovery.client import connect_etcd
from lorafleet.discovery.errors import EtcdUnavailableError
from tests.faults import TcpProxy


async def test_a_call_whose_channel_is_closed_under_it_fails_as_etcd_unavailable(
    etcd_url: str, namespace: str
) -> None:
    """The client closes a channel it left two re-opens ago (``MAX_RETIRED_CHANNELS``);
    gRPC then cancels the calls still on it. The calling task was not cancelled: it must
    see a failed call, or its retry loop (the lease keeper's, a watch's) ends for good.
    The test closes the channel itself while the call waits on a stalled link."""
    proxy = await TcpProxy(int(etcd_url.rsplit(":", 1)[1])).start()
    etcd = await connect_etcd(proxy.url)
    try:
        key = f"{namespace}/stalled-get"
        proxy.stall_when_sent(key.encode())

        async def get() -> None:
            with etcd.errors("get", key):
                await etcd.get(key.encode())

        call = asyncio.create_task(get())
        async with asyncio.timeout(10):
            await proxy.was_stalled.wait()
        await etcd.channel.close()
        with pytest.raises(EtcdUnavailableError, match="channel was closed"):
            await call
    finally:
        await etcd.close()
        await proxy.aclose()
