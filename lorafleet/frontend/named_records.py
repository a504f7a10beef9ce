"""Records by name under one etcd prefix, kept without a lease: read from a watch cache, and
written so that this frontend's own cache shows a write before the write answers.

The base of the desired adapter state (``desired_state.py``) and of the aliases
(``aliases.py``): each names its prefix, key and decoder in ``start``, and writes in its own
way (a plain put, a compare-and-swap). Reads never touch etcd.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Final, Generic, Protocol, TypeAlias, TypeVar

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.proto.naming import lora_slug

__all__ = ["CACHE_SYNC_TIMEOUT_S", "KeyOf", "Named", "NamedRecords", "synced"]

CACHE_SYNC_TIMEOUT_S: Final = 5.0
"""How long a write waits for this frontend's cache to show it before answering anyway."""

KeyOf: TypeAlias = Callable[[str, str], str]
"""``(namespace, slug)`` to the record's etcd key, e.g. ``discovery.keys.alias_key``."""


class Named(Protocol):
    """A record that carries its own name (``AdapterSpec``, ``Alias``)."""

    @property
    def name(self) -> str:
        """The record's name; its key holds the name's slug."""
        ...


R = TypeVar("R", bound=Named)
T = TypeVar("T")


async def synced(cache: WatchCache[T], done: Callable[[Mapping[str, T]], bool]) -> None:
    """Wait until this frontend's cache shows a write (read your writes), a while at most
    (``CACHE_SYNC_TIMEOUT_S``): a request right after the write then finds it."""
    with contextlib.suppress(TimeoutError):
        await cache.wait_until(done, CACHE_SYNC_TIMEOUT_S)


class NamedRecords(Generic[R]):
    """Records by name, following one prefix of a namespace."""

    def __init__(
        self, etcd: EtcdClient, namespace: str, cache: WatchCache[R], key_of: KeyOf
    ) -> None:
        self._etcd = etcd
        self.namespace = namespace
        self.cache = cache
        self._key_of = key_of

    async def aclose(self) -> None:
        """Stop following etcd."""
        await self.cache.aclose()

    def key(self, name: str) -> str:
        """The etcd key of record ``name`` (its slug: names may contain ``/``)."""
        return self._key_of(self.namespace, lora_slug(name))

    def get(self, name: str) -> R | None:
        """Record ``name``, or None (also when another name has the same slug)."""
        record = self.cache.items.get(self.key(name))
        return record if record is not None and record.name == name else None

    def records(self) -> list[R]:
        """Every record, sorted by name."""
        return sorted(self.cache.items.values(), key=lambda record: record.name)

    async def _wait_for(self, key: str, record: R | None) -> None:
        """Wait until this frontend's cache holds ``record`` at ``key`` (None: nothing)."""
        await synced(self.cache, lambda items: items.get(key) == record)
