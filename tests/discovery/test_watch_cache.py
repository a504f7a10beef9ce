"""The watch cache against a real etcd: random storms, restarts, partitions, compaction."""

from __future__ import annotations

import asyncio
import random

import structlog

from lorafleet.discovery.client import connect_etcd
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.launch.local_servers import LocalServer
from tests.faults import TcpProxy

SEED = 20261130


def _as_text(raw: bytes) -> str:
    if not raw.startswith(b"ok:"):
        raise ValueError("not an ok: record")
    return raw.decode()


async def _etcd_view(etcd, prefix: str) -> dict[str, str]:
    return {kv.key.decode(): kv.value.decode() for kv in await etcd.get_prefix(prefix.encode())}


async def _random_storm(etcd, prefix: str, count: int, rng: random.Random) -> None:
    for step in range(count):
        key = f"{prefix}{rng.randrange(50)}"
        if rng.random() < 0.35:
            await etcd.delete(key.encode())
        else:
            await etcd.put(key.encode(), f"ok:{step}".encode())


async def test_cache_follows_a_thousand_random_changes(etcd, namespace):
    prefix = f"{namespace}/"
    async with await WatchCache.start(etcd, prefix, _as_text) as cache:
        await _random_storm(etcd, prefix, 1000, random.Random(SEED))
        expected = await _etcd_view(etcd, prefix)
        await cache.wait_until(lambda items: dict(items) == expected, timeout_s=10)


async def test_listeners_hear_adds_and_removes(etcd, namespace):
    heard: list[tuple[str, str | None, str | None]] = []
    async with await WatchCache.start(etcd, f"{namespace}/", _as_text) as cache:
        cache.subscribe(lambda key, old, new: heard.append((key, old, new)))
        await etcd.put(f"{namespace}/a".encode(), b"ok:1")
        await etcd.delete(f"{namespace}/a".encode())
        await cache.wait_until(lambda items: len(heard) == 2, timeout_s=5)
    assert heard == [(f"{namespace}/a", None, "ok:1"), (f"{namespace}/a", "ok:1", None)]


async def test_a_prefix_bigger_than_grpcs_4_mib_message_limit_is_listed_whole(etcd, namespace):
    """1,500 records of 3 KiB: one answer would be 4.5 MiB, which gRPC refuses; pages pass."""
    prefix = f"{namespace}/"
    gate = asyncio.Semaphore(32)

    async def put(index: int) -> None:
        async with gate:
            await etcd.put(f"{prefix}{index:05d}".encode(), b"ok:" + b"x" * 3072)

    await asyncio.gather(*(put(index) for index in range(1500)))
    async with await WatchCache.start(etcd, prefix, _as_text) as cache:
        assert len(cache.items) == 1500


async def test_a_listing_read_page_by_page_is_whole_and_the_watch_follows_it(etcd, namespace):
    prefix = f"{namespace}/"
    for index in range(10):
        await etcd.put(f"{prefix}{index}".encode(), f"ok:{index}".encode())
    async with await WatchCache.start(etcd, prefix, _as_text, page_keys=3) as cache:
        assert cache.items == {f"{prefix}{index}": f"ok:{index}" for index in range(10)}
        await etcd.put(f"{prefix}3".encode(), b"ok:changed")
        await cache.wait_until(lambda items: items[f"{prefix}3"] == "ok:changed", timeout_s=5)


async def test_bad_record_is_skipped_and_the_watch_goes_on(etcd, namespace):
    async with await WatchCache.start(etcd, f"{namespace}/", _as_text) as cache:
        await etcd.put(f"{namespace}/bad".encode(), b"\xff garbage")
        await etcd.put(f"{namespace}/good".encode(), b"ok:1")
        await cache.wait_until(lambda items: f"{namespace}/good" in items, timeout_s=5)
        assert f"{namespace}/bad" not in cache.items


async def test_cache_catches_up_after_etcd_restarts(own_etcd: LocalServer, namespace):
    etcd = await connect_etcd(own_etcd.url)
    prefix = f"{namespace}/"
    async with await WatchCache.start(etcd, prefix, _as_text) as cache:
        await etcd.put(f"{prefix}before".encode(), b"ok:0")
        with structlog.testing.capture_logs() as logs:
            await asyncio.to_thread(own_etcd.restart)
            writer = await connect_etcd(own_etcd.url)
            await _random_storm(writer, prefix, 100, random.Random(SEED))
            expected = await _etcd_view(writer, prefix)
            await cache.wait_until(lambda items: dict(items) == expected, timeout_s=15)
        await writer.close()
    warnings = [log for log in logs if log["log_level"] == "warning"]
    assert 1 <= len(warnings) <= 2  # a line when the watch breaks, not one per retry
    await etcd.close()


async def test_compacted_revision_during_a_partition_does_not_break_the_watch(
    etcd_url, etcd, namespace
):
    proxy = await TcpProxy(int(etcd_url.rsplit(":", 1)[1])).start()
    through_proxy = await connect_etcd(proxy.url)
    prefix = f"{namespace}/"
    async with await WatchCache.start(through_proxy, prefix, _as_text) as cache:
        proxy.cut()
        await _random_storm(etcd, prefix, 200, random.Random(SEED))
        status = await etcd.put(f"{prefix}last".encode(), b"ok:last")
        await etcd.compact(status.header.revision)
        proxy.restore()
        expected = await _etcd_view(etcd, prefix)
        await cache.wait_until(lambda items: dict(items) == expected, timeout_s=15)
    await through_proxy.close()
    await proxy.aclose()


async def test_a_silently_stalled_link_is_found_out_and_followed_again_after(
    etcd_url, etcd, namespace
):
    """No byte passes and no reset comes: only gRPC's keepalive ping can tell."""
    proxy = await TcpProxy(int(etcd_url.rsplit(":", 1)[1])).start()
    through_proxy = await connect_etcd(proxy.url)
    prefix = f"{namespace}/"
    async with await WatchCache.start(through_proxy, prefix, _as_text) as cache:
        assert cache.in_sync
        proxy.stall()
        async with asyncio.timeout(30):
            while cache.in_sync:
                await asyncio.sleep(0.05)
        await etcd.put(f"{prefix}meanwhile".encode(), b"ok:meanwhile")
        proxy.restore()
        await cache.wait_until(lambda items: "meanwhile" in str(dict(items)), timeout_s=15)
        assert cache.in_sync
    await through_proxy.close()
    await proxy.aclose()
