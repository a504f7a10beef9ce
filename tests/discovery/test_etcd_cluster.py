"""A three-member etcd cluster from the pip-installed binary: clients follow its members.

A dead first endpoint, a member that moves, a TLS member that dies, a stalled member.
Killing the leader under load (no record, no lease and, aim, no request lost) runs in
``make test-chaos``: ``tests/chaos/test_etcd_cluster.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

import pytest

from lorafleet.discovery.client import EtcdClient, connect_etcd
from lorafleet.discovery.errors import EtcdUnavailableError
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.discovery.settings import EtcdSettings, parse_endpoints
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.launch.etcd_cluster import start_etcd_cluster
from lorafleet.launch.local_servers import free_port
from lorafleet.launch.tls_files import make_tls_files
from tests.faults import TcpProxy

pytestmark = pytest.mark.slow


async def test_a_dead_first_member_is_skipped_and_errors_name_every_endpoint(
    etcd_url: str,
) -> None:
    dead = f"http://localhost:{free_port()}"  # a DNS name, resolved at connect
    etcd = await connect_etcd(f"{dead},{etcd_url}")
    assert await etcd.status()
    await etcd.close()
    also_dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EtcdUnavailableError, match=f"etcd at {dead},{also_dead} is unavailable"):
        await connect_etcd(f"{dead},{also_dead}")


async def test_a_member_whose_name_moves_to_a_new_address_is_found_again(
    etcd_url: str, namespace: str
) -> None:
    """DNS cannot change here: a stand-in resolver maps the names, and TCP proxies to the
    shared etcd play the members' addresses. The lease must live on through the move."""
    etcd_port = int(etcd_url.rsplit(":", 1)[1])
    before, after = await TcpProxy(etcd_port).start(), await TcpProxy(etcd_port).start()
    ports = {"etcd-a": before.port, "etcd-b": free_port()}  # etcd-b: nothing listens

    def resolve(host: str, port: int) -> list[str]:
        return [f"127.0.0.1:{ports[host]}"]

    etcd = await connect_etcd("http://etcd-a:2379,http://etcd-b:2379", resolve=resolve)
    keeper = await LeaseKeeper.grant(etcd, 2)
    await keeper.put(f"{namespace}/a", b"1")
    ports["etcd-a"] = after.port  # the member moved ...
    await before.aclose()  # ... and its old address is gone
    async with asyncio.timeout(10):
        while (record := await _get_quietly(etcd, f"{namespace}/a")) is None:
            await asyncio.sleep(0.05)
    assert record.lease == keeper.lease_id
    await keeper.aclose()
    await etcd.close()
    await after.aclose()


async def _get_quietly(etcd: EtcdClient, key: str) -> Any:
    try:
        with etcd.errors("get", key):
            return await etcd.get(key.encode())
    except EtcdUnavailableError:
        return None


async def test_a_tls_client_fails_over_when_the_member_it_uses_dies(tmp_path: Path) -> None:
    """Every member is checked against the first endpoint's name (one shared certificate)."""
    tls = make_tls_files(tmp_path / "tls")
    cluster = await asyncio.to_thread(start_etcd_cluster, tmp_path / "etcd", tls=tls)
    settings = EtcdSettings(
        endpoints=parse_endpoints(cluster.endpoints), ca_path=tls.ca_cert,
        client_cert_path=tls.client_cert, client_key_path=tls.client_key,
    )  # fmt: skip
    try:
        etcd = await connect_etcd(settings)
        await etcd.put(b"v1/x", b"1")
        cluster.members[0].stop(kill=True)  # pick_first uses the first member that answers
        async with asyncio.timeout(10):
            while (record := await _get_quietly(etcd, "v1/x")) is None:
                await asyncio.sleep(0.05)
        assert record.value == b"1"
        await etcd.close()
    finally:
        cluster.stop()


async def test_a_stalled_member_is_left_for_the_majority_and_no_lease_is_lost(
    tmp_path: Path, namespace: str
) -> None:
    """SIGSTOP keeps the member's TCP connections open, so only gRPC keepalive pings show
    that it stopped answering. The stalled member is a follower listed first: the lease
    lives on the leader and expires unless the keeper reaches the majority within the TTL."""
    cluster = await asyncio.to_thread(start_etcd_cluster, tmp_path / "etcd")
    leader = await asyncio.to_thread(cluster.wait_for_leader)
    follower, *others = [m for m in cluster.members if m is not leader] + [leader]
    etcd = await connect_etcd(",".join(m.url for m in [follower, *others]))
    witness = await connect_etcd(",".join(m.url for m in others))  # never meets the stall
    removed: list[str] = []
    try:
        keeper = await LeaseKeeper.grant(etcd, 10)  # the worker's default TTL
        await keeper.put(f"v1/{namespace}/a", b"1")
        seen = await WatchCache.start(witness, f"v1/{namespace}/", bytes)
        seen.subscribe(lambda key, old, new: removed.append(key) if new is None else None)
        follower.process.send_signal(signal.SIGSTOP)
        async with asyncio.timeout(30):  # puts meet the stall until the pings find it out
            while await _get_quietly(etcd, f"v1/{namespace}/b") is None:
                with contextlib.suppress(EtcdUnavailableError):
                    await keeper.put(f"v1/{namespace}/b", b"2")
        assert removed == [] and not keeper.expired
        await keeper.aclose()
        await seen.aclose()
    finally:
        follower.process.send_signal(signal.SIGCONT)
        await etcd.close()
        await witness.close()
        cluster.stop()
