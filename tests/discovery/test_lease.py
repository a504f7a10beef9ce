"""The lease keeper against a real etcd: expiry, re-grant, recovery after a restart."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest
import structlog

from lorafleet.discovery.client import ETCD_OP_TIMEOUT_S, connect_etcd
from lorafleet.discovery.errors import EtcdUnavailableError
from lorafleet.discovery.lease import LeaseKeeper, LeaseState
from lorafleet.launch.local_servers import LocalServer
from tests.faults import TcpProxy

TTL_S = 2


async def _wait_gone(etcd, key: str, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while await etcd.get(key.encode()) is not None:
            await asyncio.sleep(0.05)


async def test_records_of_a_killed_process_vanish_within_ttl(etcd_url, etcd, namespace):
    key = f"v1/instances/{namespace}/backend/generate/1"
    owner = textwrap.dedent(f"""
        import asyncio, sys
        from lorafleet.process.logs import configure_logging
        configure_logging(process="owner")
        from lorafleet.discovery.client import ETCD_OP_TIMEOUT_S, connect_etcd
        from lorafleet.discovery.lease import LeaseKeeper
        async def main():
            etcd = await connect_etcd({etcd_url!r})
            keeper = await LeaseKeeper.grant(etcd, {TTL_S})
            await keeper.put({key!r}, b"{{}}")
            print("ready", flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, cwd=os.getcwd())
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"  # logs go to stderr
    assert await etcd.get(key.encode()) is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    await _wait_gone(etcd, key, TTL_S + 1)


async def test_revoke_on_close_deletes_records_at_once(etcd, namespace):
    keeper = await LeaseKeeper.grant(etcd, 30)
    await keeper.put(f"{namespace}/a", b"1")
    await keeper.aclose()
    assert await etcd.get(f"{namespace}/a".encode()) is None
    assert keeper.state is LeaseState.CLOSED


async def test_lost_lease_is_regranted_with_the_same_id_and_records_put_back(etcd, namespace):
    async with await LeaseKeeper.grant(etcd, TTL_S) as keeper:
        await keeper.put(f"{namespace}/a", b"1")
        await keeper.put(f"{namespace}/b", b"2")
        await etcd.revoke_lease(keeper.lease_id)  # as if it had expired
        assert await etcd.get(f"{namespace}/a".encode()) is None
        async with asyncio.timeout(TTL_S + 1):
            while (got := await etcd.get(f"{namespace}/b".encode())) is None:
                await asyncio.sleep(0.05)
        assert got.lease == keeper.lease_id
        assert (await etcd.get(f"{namespace}/a".encode())).value == b"1"


async def test_records_come_back_after_etcd_restarts(own_etcd: LocalServer, namespace):
    etcd = await connect_etcd(own_etcd.url)
    keeper = await LeaseKeeper.grant(etcd, TTL_S)
    await keeper.put(f"{namespace}/a", b"1")
    with structlog.testing.capture_logs() as logs:
        own_etcd.stop()
        await _keep_alives_fail(etcd, times=3)
        assert keeper.state is LeaseState.RECOVERING
        await asyncio.to_thread(own_etcd.restart)
        async with asyncio.timeout(TTL_S * 3):
            while keeper.state is not LeaseState.ACTIVE:
                await asyncio.sleep(0.05)
    failed = [log for log in logs if log["event"] == "lease keep-alive failed"]
    assert len(failed) == 1  # several keep-alives failed: one line says so, not one each
    await asyncio.sleep(TTL_S + 0.5)  # longer than the TTL: the lease must really be alive
    got = await etcd.get(f"{namespace}/a".encode())
    assert got is not None and got.lease == keeper.lease_id
    info = await etcd.get_lease_info(keeper.lease_id)
    assert info.TTL > 0
    await keeper.aclose()
    await etcd.close()


async def _keep_alives_fail(etcd, *, times: int) -> None:
    """Return once ``times`` keep-alives have failed on ``etcd`` (whose server is down).

    Counts the real client's calls by wrapping its method; nothing is faked."""
    failed = asyncio.Event()
    failures = 0
    real_keep_alive = etcd.keep_lease_alive

    async def counted(lease_id: int) -> int:
        nonlocal failures
        try:
            return await real_keep_alive(lease_id)
        except Exception:
            failures += 1
            if failures >= times:
                failed.set()
            raise

    etcd.keep_lease_alive = counted
    try:
        async with asyncio.timeout(TTL_S * 10):
            await failed.wait()
    finally:
        etcd.keep_lease_alive = real_keep_alive


async def test_put_while_etcd_is_down_raises_a_clear_error(own_etcd: LocalServer, namespace):
    etcd = await connect_etcd(own_etcd.url)
    keeper = await LeaseKeeper.grant(etcd, TTL_S)
    own_etcd.stop()
    with pytest.raises(EtcdUnavailableError, match=f"put of '{namespace}/a' failed"):
        await keeper.put(f"{namespace}/a", b"1")
    assert f"{namespace}/a" not in keeper.records
    await keeper.aclose(revoke=False)
    await etcd.close()


async def test_calls_to_an_etcd_that_never_answers_fail_instead_of_hanging(etcd_url, namespace):
    proxy = await TcpProxy(int(etcd_url.rsplit(":", 1)[1])).start()
    etcd = await connect_etcd(proxy.url)
    keeper = await LeaseKeeper.grant(etcd, TTL_S)
    proxy.stall()
    async with asyncio.timeout(ETCD_OP_TIMEOUT_S * 3):  # a guard: a hang fails the test
        with pytest.raises(EtcdUnavailableError, match=f"put of '{namespace}/a' failed"):
            await keeper.put(f"{namespace}/a", b"1")
        # keep-alives time out too; the TTL may run out first (then EXPIRED)
        while keeper.state is LeaseState.ACTIVE:
            await asyncio.sleep(0.05)
    proxy.restore()
    await keeper.aclose(revoke=False)
    await etcd.close()
    await proxy.aclose()


async def test_a_task_cancelled_in_an_etcd_call_stays_cancelled_while_etcd_is_down(own_etcd):
    """gRPC now and then reports a keep-alive cancelled under it as UNAVAILABLE; the
    keeper's retry loop took that for an etcd error, went on, and ``aclose`` hung (CI)."""
    etcd = await connect_etcd(own_etcd.url)
    lease = await etcd.lease(TTL_S)
    own_etcd.stop()

    async def keep_alive_once() -> None:
        with etcd.errors("keep lease alive"):
            await etcd.keep_lease_alive(lease.id)

    delays = random.Random(0)
    for _ in range(300):
        call = asyncio.create_task(keep_alive_once())
        await asyncio.sleep(delays.uniform(0, 0.004))
        if call.cancel():  # still running: it must end cancelled, whatever gRPC reports
            with pytest.raises(asyncio.CancelledError):
                await call
        else:
            assert isinstance(call.exception(), EtcdUnavailableError)
    await etcd.close()


async def test_a_lease_cut_off_past_its_ttl_is_known_expired_and_put_back_on_heal(
    etcd_url, etcd, namespace
):
    proxy = await TcpProxy(int(etcd_url.rsplit(":", 1)[1])).start()
    behind = await connect_etcd(proxy.url)
    keeper = await LeaseKeeper.grant(behind, TTL_S)
    await keeper.put(f"{namespace}/a", b"1")
    proxy.cut()
    async with asyncio.timeout(TTL_S * 10):
        while not keeper.expired:  # counted down from the last renewal etcd confirmed
            await asyncio.sleep(0.05)
    await _wait_gone(etcd, f"{namespace}/a", TTL_S * 5)  # etcd agrees
    proxy.restore()
    async with asyncio.timeout(TTL_S * 10):
        while keeper.state is not LeaseState.ACTIVE:
            await asyncio.sleep(0.05)
    assert (await etcd.get(f"{namespace}/a".encode())) is not None
    await keeper.aclose()
    await behind.close()
    await proxy.aclose()
