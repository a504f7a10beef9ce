"""The mocker's paged KV cache: prefix hits, pinning, LRU eviction and the events it emits."""

from __future__ import annotations

from lorafleet.fleet.kv_blocks import block_hashes
from lorafleet.proto.kv_events import BlocksRemoved, BlocksStored, KvEvent, VersionCleared
from lorafleet.worker.engines._kv_cache import KvCache

V1, V2 = "pirate@sha256:aa", "pirate@sha256:bb"


def _cache(num_blocks: int = 8) -> tuple[KvCache, list[KvEvent]]:
    events: list[KvEvent] = []
    return KvCache(block_size=4, num_blocks=num_blocks, sink=events.append), events


def _hashes(words: int, version: str = V1, salt: str = "") -> list[int]:
    return block_hashes(list(range(words)), 4, version, salt)


def test_a_prompt_sent_twice_hits_every_cached_block_and_stores_them_once() -> None:
    cache, events = _cache()
    hashes = _hashes(12)
    first = cache.hold(V1, hashes)
    cache.release(first.pinned)
    second = cache.hold(V1, hashes)
    assert (first.hits, second.hits) == (0, 3)
    assert events == [BlocksStored(version=V1, hashes=hashes)]


def test_a_longer_prompt_hits_the_shared_prefix_and_stores_only_its_own_blocks() -> None:
    cache, events = _cache()
    cache.release(cache.hold(V1, _hashes(8)).pinned)
    longer = _hashes(16)
    assert cache.hold(V1, longer).hits == 2
    assert events[-1] == BlocksStored(version=V1, hashes=longer[2:])


def test_another_version_or_salt_shares_no_block() -> None:
    cache, _ = _cache()
    cache.release(cache.hold(V1, _hashes(8)).pinned)
    assert cache.hold(V2, _hashes(8, V2)).hits == 0
    assert cache.hold(V1, _hashes(8, salt="tenant-a")).hits == 0


def test_a_full_cache_evicts_the_least_recently_used_idle_block() -> None:
    cache, events = _cache(num_blocks=2)
    old, new = _hashes(4, salt="old"), _hashes(4, salt="new")
    cache.release(cache.hold(V1, old).pinned)
    cache.release(cache.hold(V1, new).pinned)
    cache.release(cache.hold(V1, old).pinned)  # used again: "new" is now the oldest
    third = _hashes(4, salt="third")
    cache.hold(V1, third)
    assert events[-2:] == [
        BlocksRemoved(version=V1, hashes=new),
        BlocksStored(version=V1, hashes=third),
    ]
    assert cache.hold(V1, old).hits == 1


def test_blocks_a_running_request_holds_are_never_evicted() -> None:
    cache, events = _cache(num_blocks=2)
    running = cache.hold(V1, _hashes(8))
    other = cache.hold(V1, _hashes(8, salt="other"))
    assert other.pinned == [] and len(events) == 1  # no room: nothing stored, nothing evicted
    cache.release(running.pinned)
    assert cache.hold(V1, _hashes(8)).hits == 2


def test_clearing_a_version_drops_its_blocks_only() -> None:
    cache, events = _cache()
    running = cache.hold(V1, _hashes(8))
    cache.release(cache.hold(V2, _hashes(8, V2)).pinned)
    cache.clear(V1)
    cache.release(running.pinned)  # its blocks went meanwhile: nothing to release
    assert events[-1] == VersionCleared(version=V1)
    assert cache.blocks() == {V2: 2}
    assert cache.hold(V1, _hashes(8)).hits == 0
