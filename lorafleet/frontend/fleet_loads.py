"""The workers' load records (``v1/load/{ns}/...``), followed by a watch cache, read by id.

Every worker publishes one ``InstanceLoad`` under its lease: its free slots, its
in-flight requests, its adapters' demand, the loads that failed there and the
unmanaged adapters placement evicted. The
frontend reads them to send on-demand loads where there is room and to tell
clients and operators an adapter's state; it never writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import load_prefix, parse_load_key
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.proto.fleet_load import (
    EvictedAdapter,
    InstanceLoad,
    LoadFailure,
    decode_instance_load,
)

__all__ = ["FleetLoads"]

_T = TypeVar("_T")


class FleetLoads:
    """The live load records of one namespace, by instance id (a worker without one: None).

    Indexed by adapter as records change, so that a status (``/v1/models`` builds
    one per cold adapter) costs the adapter's entries, not a scan of every record.
    """

    def __init__(self, cache: WatchCache[InstanceLoad]) -> None:
        self.cache = cache
        self._by_id: dict[int, InstanceLoad] = {}
        self._loading: dict[str, dict[int, bool]] = {}
        self._failed: dict[str, dict[int, LoadFailure]] = {}
        self._demand: dict[str, dict[int, float]] = {}
        self._evicted: dict[str, dict[int, EvictedAdapter]] = {}
        for key, load in cache.items.items():
            self._changed(key, None, load)
        self._unsubscribe = cache.subscribe(self._changed)

    @classmethod
    async def start(cls, etcd: EtcdClient, namespace: str) -> FleetLoads:
        """List the records now (raises ``EtcdUnavailableError``) and follow them."""
        return cls(await WatchCache.start(etcd, load_prefix(namespace), decode_instance_load))

    async def aclose(self) -> None:
        """Stop following etcd."""
        self._unsubscribe()
        await self.cache.aclose()

    def records(self) -> Mapping[int, InstanceLoad]:
        """Every live record by instance id (read-only view)."""
        return self._by_id

    def of(self, instance_id: int) -> InstanceLoad | None:
        """The record of ``instance_id``, or None when it publishes none (yet)."""
        return self._by_id.get(instance_id)

    def demand(self, adapter: str) -> float:
        """Requests per second for ``adapter`` across the fleet (the records' sum)."""
        return sum(self._demand.get(adapter, {}).values())

    def loading(self, adapter: str) -> list[int]:
        """Ids of the instances loading ``adapter`` now, sorted."""
        return sorted(self._loading.get(adapter, ()))

    def failures(self, adapter: str) -> dict[int, LoadFailure]:
        """The last failed load of ``adapter`` on each instance that lists one."""
        return dict(self._failed.get(adapter, {}))

    def evicted(self) -> list[str]:
        """Names of the unmanaged adapters placement evicted (on some instance), sorted."""
        return sorted(self._evicted)

    def last_eviction(self, adapter: str) -> tuple[int, EvictedAdapter] | None:
        """The newest eviction of unmanaged ``adapter`` and the instance it left, or None."""
        entries = self._evicted.get(adapter)
        if not entries:
            return None
        return max(entries.items(), key=lambda entry: entry[1].at)

    def _changed(self, key: str, old: InstanceLoad | None, new: InstanceLoad | None) -> None:
        """Move the instance's entries in the indexes from ``old`` to ``new``."""
        try:
            _endpoint, instance_id = parse_load_key(key)
        except ValueError:  # not a load record: nothing to index
            return
        if old is not None:
            self._by_id.pop(instance_id, None)
            for name in old.loading:
                _drop(self._loading, name, instance_id)
            for name in old.failed:
                _drop(self._failed, name, instance_id)
            for name in old.demand:
                _drop(self._demand, name, instance_id)
            for name in old.evicted:
                _drop(self._evicted, name, instance_id)
        if new is not None:
            self._by_id[instance_id] = new
            for name in new.loading:
                self._loading.setdefault(name, {})[instance_id] = True
            for name, failure in new.failed.items():
                self._failed.setdefault(name, {})[instance_id] = failure
            for name, rate in new.demand.items():
                self._demand.setdefault(name, {})[instance_id] = rate
            for name, gone in new.evicted.items():
                self._evicted.setdefault(name, {})[instance_id] = gone


def _drop(index: dict[str, dict[int, _T]], name: str, instance_id: int) -> None:
    """Remove ``instance_id`` from ``index[name]``, and the entry once it is empty."""
    entries = index.get(name)
    if entries is not None:
        entries.pop(instance_id, None)
        if not entries:
            del index[name]
