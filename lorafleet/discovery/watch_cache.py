"""A local copy of an etcd prefix that follows every change.

List the prefix at revision R (page by page), watch from R+1, apply PUT and
DELETE events; on any stream failure or compaction, list again and carry on,
so the cache always converges to etcd. Subscribers hear every add and remove exactly once.
``catch_up`` waits until the copy holds every key etcd holds now (read your writes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Final, Generic, TypeAlias, TypeVar

import msgspec
import structlog
from aetcd.rtypes import Event

from lorafleet.discovery.client import EtcdClient
from lorafleet.process.backoff import backoff_s
from lorafleet.process.tasks import cancel_and_wait

__all__ = ["WatchCache", "WatchListener"]

log = structlog.get_logger(__name__)

T = TypeVar("T")
WatchListener: TypeAlias = Callable[[str, "T | None", "T | None"], None]
"""Called as ``listener(key, old, new)``: add has ``old=None``, remove has ``new=None``."""

MAX_BACKOFF_S: Final = 0.5
"""Re-list at least this often while etcd is away, so the cache catches up within about
1 s of its return (the channel reconnects within ``MAX_RECONNECT_BACKOFF_MS``)."""

LIST_PAGE_KEYS: Final = 1000
"""Keys per listing page: a page of 1,000 cards is about 0.6 MB, well under gRPC's 4 MiB."""


class WatchCache(Generic[T]):
    """Decoded records under one prefix, kept equal to etcd by ``_watch_loop``."""

    def __init__(
        self,
        etcd: EtcdClient,
        prefix: str,
        decode: Callable[[bytes], T],
        *,
        page_keys: int = LIST_PAGE_KEYS,
        hide_keys: bool = False,
    ) -> None:
        self._etcd = etcd
        self.prefix = prefix
        self._decode = decode
        self._page_keys = page_keys
        self._hide_keys = hide_keys
        """Log only the prefix, never a key: the keys are secrets' hashes (API keys)."""
        self._items: dict[str, T] = {}
        self.revision = 0
        self.changes = 0
        """How many adds, updates and removes were applied: a key for caches built from it."""
        self.in_sync = False
        """Whether the cache follows etcd now: False from a watch failure (etcd cut off or
        stalled) until a listing or a new watch succeeds; the items are then the last view."""
        self._listeners: list[WatchListener[T]] = []
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._catching_up: asyncio.Task[None] | None = None
        self._next_catch_up: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        etcd: EtcdClient,
        prefix: str,
        decode: Callable[[bytes], T],
        *,
        page_keys: int = LIST_PAGE_KEYS,
        hide_keys: bool = False,
    ) -> WatchCache[T]:
        """List ``prefix`` now (raises ``EtcdUnavailableError``) and follow it from there;
        ``hide_keys``: logs name the prefix, never a key."""
        cache = cls(etcd, prefix, decode, page_keys=page_keys, hide_keys=hide_keys)
        await cache._relist()
        cache._task = asyncio.create_task(cache._watch_loop(), name=f"watch {prefix}")
        return cache

    async def __aenter__(self) -> WatchCache[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def items(self) -> Mapping[str, T]:
        """The current records by key (read-only view)."""
        return self._items

    def subscribe(self, listener: WatchListener[T]) -> Callable[[], None]:
        """Call ``listener`` on every change from now on; returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def wait_until(
        self, predicate: Callable[[Mapping[str, T]], bool], timeout_s: float
    ) -> None:
        """Wait until ``predicate(items)`` holds; raises TimeoutError after ``timeout_s``."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: predicate(self._items))

    async def catch_up(self, timeout_s: float) -> None:
        """Wait until the cache holds every key under the prefix as etcd holds it now.

        Reads etcd's newest ``mod_revision`` there (``EtcdUnavailableError`` when etcd is
        away), then waits for the watch to apply it (TimeoutError after ``timeout_s``).
        Callers share reads: one that arrives while a read runs waits for the next one,
        which starts after it, so that every caller sees etcd as it was when it asked.
        """
        running = self._catching_up
        if running is None or running.done():
            self._catching_up = running = _task(self._caught_up(timeout_s))
        elif self._next_catch_up is None:
            self._next_catch_up = running = _task(self._after(running, timeout_s))
        else:
            running = self._next_catch_up
        await asyncio.shield(running)

    async def _after(self, previous: asyncio.Task[None], timeout_s: float) -> None:
        await asyncio.gather(previous, return_exceptions=True)
        self._catching_up, self._next_catch_up = self._next_catch_up, None
        await self._caught_up(timeout_s)

    async def _caught_up(self, timeout_s: float) -> None:
        with self._etcd.errors("newest revision", self.prefix):
            newest = await self._etcd.newest_revision(self.prefix.encode())
        if self.revision < newest:
            await self.wait_until(lambda _items: self.revision >= newest, timeout_s)

    async def aclose(self) -> None:
        """Stop following etcd."""
        for waiting in (self._catching_up, self._next_catch_up):
            if waiting is not None:
                waiting.cancel()
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _watch_loop(self) -> None:
        failures = 0
        while True:
            try:
                await self._follow()  # ends only by raising
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self.in_sync = False
                # one warning when the trouble starts and one line when it ends, not one per try
                report = log.warning if failures == 1 else log.debug
                report("watch interrupted; re-listing", prefix=self.prefix, error=repr(exc))
                await asyncio.sleep(backoff_s(failures, cap_s=MAX_BACKOFF_S))
                if await self._relist_quietly():
                    if failures > 1:
                        log.info("watch resumed", prefix=self.prefix, failed_tries=failures)
                    failures = 0

    async def _follow(self) -> None:
        """Watch from the revision after the last one applied until the stream ends."""
        with self._etcd.errors("watch", self.prefix):
            watch = await self._etcd.watch_prefix(
                self.prefix.encode(), start_revision=self.revision + 1
            )
        self.in_sync = True  # the watch replays every change since the last one applied
        try:
            with self._etcd.errors("watch", self.prefix):  # "no leader": leave that member
                async for event in watch:
                    await self._on_event(event)
        finally:
            await asyncio.shield(watch.cancel())
        raise ConnectionError("watch stream ended")

    async def _on_event(self, event: Event) -> None:
        key = event.kv.key.decode()
        value = self._decode_or_none(key, event.kv.value) if event.kind == "PUT" else None
        self._apply(key, value)
        self.revision = max(self.revision, event.kv.mod_revision)
        await self._notify()

    async def _relist_quietly(self) -> bool:
        """Re-list; False (logged at debug only) while etcd is still away: the loop retries."""
        try:
            await self._relist()
        except Exception as exc:
            log.debug("re-list failed", prefix=self.prefix, error=str(exc))
            return False
        return True

    async def _relist(self) -> None:
        """Replace the cache with a fresh listing, telling listeners what changed."""
        with self._etcd.errors("list", self.prefix):
            fresh, revision = await self._list()
        for key in self._items.keys() - fresh.keys():
            self._apply(key, None)
        for key, value in fresh.items():
            self._apply(key, value)
        self.revision = revision
        self.in_sync = True
        await self._notify()

    async def _list(self) -> tuple[dict[str, T | None], int]:
        """Every record under the prefix at one revision, read ``LIST_PAGE_KEYS`` at a time
        and decoded page by page (None: does not decode).

        One page at a time keeps each answer under gRPC's message limit and etcd's
        read short; every page reads the first page's revision, so the listing is one
        snapshot (a compaction in between fails the listing, and the loop lists again).
        Decoding each page as it comes keeps one page of raw bytes in memory, not the
        whole listing (10,000 cards: 6 MB that the allocator keeps once freed).
        """
        prefix = self.prefix.encode()
        fresh: dict[str, T | None] = {}
        start, revision = prefix, 0
        while True:
            page = await self._etcd.list_page(
                prefix, start, limit=self._page_keys, revision=revision
            )
            revision = revision or page.header.revision
            for kv in page.kvs:
                key = kv.key.decode()
                fresh[key] = self._decode_or_none(key, kv.value)
            if not page.more or not page.kvs:
                return fresh, revision
            start = page.kvs[-1].key + b"\0"

    def _apply(self, key: str, new: T | None) -> None:
        """Keep ``new`` under ``key`` (None: remove it) and tell listeners if it changed."""
        old = self._items.get(key)
        if new is None:
            self._items.pop(key, None)
        else:
            self._items[key] = new
        if old != new:
            self.changes += 1
            self._tell_listeners(key, old, new)

    def _tell_listeners(self, key: str, old: T | None, new: T | None) -> None:
        for listener in list(self._listeners):
            try:
                listener(key, old, new)
            except Exception:
                log.exception("watch listener failed", key=self._shown(key))

    def _decode_or_none(self, key: str, raw: bytes) -> T | None:
        try:
            return self._decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            log.error("skipping record that does not decode", key=self._shown(key),
                      error=str(exc))  # fmt: skip
            return None

    def _shown(self, key: str) -> str:
        """``key`` as logs show it: only the prefix when keys are hidden."""
        return f"{self.prefix}<hidden>" if self._hide_keys else key

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def _task(work: Coroutine[None, None, None]) -> asyncio.Task[None]:
    """A task whose failure its waiters hear; none is logged when they all gave up."""
    task = asyncio.create_task(work)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return task
