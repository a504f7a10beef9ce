"""The start-up retry loop: waits for a real etcd, gives up in time, stops when told."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import ClassVar

import pytest
import structlog

from lorafleet.discovery.client import connect_etcd
from lorafleet.discovery.startup import ConnectTimeoutError, connect_with_retry, unless_stopped
from lorafleet.launch.local_servers import free_port, start_etcd
from lorafleet.proto.errors import UnavailableError


class _Refused(UnavailableError):
    """Stands in for a permanent refusal (wrong password), which a local etcd cannot give."""

    permanent: ClassVar[bool] = True


async def test_waits_for_an_etcd_that_starts_late(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    start = connect_with_retry(
        lambda: connect_etcd(url), service="etcd", url=url, timeout_s=60, check="ETCD_ENDPOINTS"
    )
    waiting = asyncio.create_task(start)
    server = await asyncio.to_thread(start_etcd, tmp_path / "etcd", port=port)
    try:
        client = await waiting
        assert (await client.status()).version
        await client.close()
    finally:
        server.stop()


async def test_gives_up_after_the_timeout_with_one_warning_and_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    calls = 0

    async def connect() -> object:
        nonlocal calls
        calls += 1
        return await connect_etcd(url)

    with structlog.testing.capture_logs() as logs, pytest.raises(ConnectTimeoutError) as caught:
        await connect_with_retry(connect, service="etcd", url=url, timeout_s=1.5,
                                 check="ETCD_ENDPOINTS")  # fmt: skip
    assert url in caught.value.message and "ETCD_ENDPOINTS" in caught.value.message
    warnings = [log for log in logs if log["log_level"] == "warning"]
    assert calls > 2 and len(warnings) == 1  # one line per change of reason, not per try
    assert warnings[0]["url"] == url and "Traceback" not in str(warnings[0])


async def test_a_permanent_error_is_not_retried() -> None:
    calls = 0

    async def connect() -> object:
        nonlocal calls
        calls += 1
        raise _Refused("etcd at x refused authenticate: bad password; check ETCD_AUTH_PASSWORD")

    with pytest.raises(_Refused):
        await connect_with_retry(connect, service="etcd", url="x", timeout_s=30, check="-")
    assert calls == 1


async def test_unless_stopped_cancels_a_start_that_waits() -> None:
    stop = asyncio.Event()
    url = f"http://127.0.0.1:{free_port()}"
    start = connect_with_retry(
        lambda: connect_etcd(url), service="etcd", url=url, timeout_s=60, check="-"
    )
    asyncio.get_running_loop().call_soon(stop.set)
    assert await unless_stopped(start, stop) is None


async def test_unless_stopped_returns_what_the_start_returned() -> None:
    async def start() -> str:
        return "ready"

    assert await unless_stopped(start(), asyncio.Event()) == "ready"


async def test_a_stop_ends_a_start_up_that_swallows_its_first_cancellation() -> None:
    """Python 3.11's ``asyncio.wait_for`` can swallow a cancellation (nats-py's connect
    uses it); the stop must still end the start-up at once, not after its connect timeout."""
    started, swallowed, connected = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def stubborn_start() -> str:
        started.set()
        try:
            await connected.wait()  # never set: the server never answers
        except asyncio.CancelledError:
            swallowed.set()
            await connected.wait()  # as if the cancellation had never come
        return "connected"

    stop = asyncio.Event()
    stopping = asyncio.ensure_future(unless_stopped(stubborn_start(), stop))
    await started.wait()
    stop.set()
    async with asyncio.timeout(30):  # the start-up itself would wait forever
        assert await stopping is None
    assert swallowed.is_set()
