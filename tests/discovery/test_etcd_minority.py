"""A client of an etcd member cut off from the other two follows the majority (issue 27).

Three members, each on a host of its own (``tests/netns.py``); etcd-a, listed first
by the client, is parted from etcd-b and etcd-c. It still answers pings and keeps the
client's watch open, with no events: the watch must leave it and follow the majority.
The long form, under load on the whole cluster, is ``tests/chaos/test_topology.py``.
Needs root, ``ip`` and ``nft``; skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lorafleet.discovery.client import connect_etcd
from lorafleet.discovery.errors import EtcdUnavailableError
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.launch.etcd_cluster import EtcdCluster
from tests.netns import Network
from tests.topology import ETCD_HOSTS, etcd_url, has_leader, start_etcd_members

pytestmark = pytest.mark.slow

PREFIX = "v1/minority/"
FOLLOW_TIMEOUT_S = 30.0
"""Generous: the bound we state is about 3 election timeouts plus one call timeout (6 s)."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Network, EtcdCluster]]:
    try:
        network = Network.create(list(ETCD_HOSTS))
    except OSError as exc:
        pytest.skip(f"network namespaces need root, ip and nft: {exc}")
    try:
        members = start_etcd_members(network, ETCD_HOSTS, tmp_path)
        yield network, members
        members.stop()
    finally:
        network.delete()


@pytest.mark.parametrize("one_way", [False, True], ids=["both-ways", "one-way"])
async def test_a_watch_on_a_member_parted_from_the_others_follows_the_majority(
    cluster: tuple[Network, EtcdCluster], one_way: bool
) -> None:
    """The key is put once etcd-a knows it has no leader, so it never reaches etcd-a."""
    network, members = cluster
    order = [network[h] for h in ("etcd-a", "etcd-b", "etcd-c")]
    watching = await connect_etcd(",".join(etcd_url(h) for h in order))
    writer = await connect_etcd(",".join(etcd_url(h) for h in reversed(order)))
    cache = await WatchCache.start(watching, PREFIX, bytes)
    try:
        for other in ("etcd-b", "etcd-c"):
            network.cut("etcd-a", other, one_way=one_way)
        cut_at = time.monotonic()
        async with asyncio.timeout(FOLLOW_TIMEOUT_S):
            while await asyncio.to_thread(has_leader, members.members[0]):
                await asyncio.sleep(0.1)  # the put must not reach etcd-a
            while not await _put(writer, f"{PREFIX}during".encode()):
                await asyncio.sleep(0.1)  # the majority may be electing a leader
        await cache.wait_until(lambda items: f"{PREFIX}during" in items, FOLLOW_TIMEOUT_S)
        print(f"followed the majority {time.monotonic() - cut_at:.2f} s after the cut")
    finally:
        network.heal()
        await cache.aclose()
        await watching.close()
        await writer.close()


async def _put(etcd, key: bytes) -> bool:
    try:
        with etcd.errors("put", key.decode()):
            await etcd.put(key, b"1")
    except EtcdUnavailableError:
        return False
    return True
