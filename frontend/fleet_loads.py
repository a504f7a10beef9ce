"""The workers' load records (``v1/load/{ns}/...``), followed by a watch cache, read by id.

Every worker publishes one ``InstanceLoad`` under its lease: its free slots, its
in-flight requests, its adapters' demand and the loads that failed there. The
frontend reads them to send on-demand loads where there is room and to tell
clients and operators an adapter's state; it never writes them.
"""

from __future__ import annotations

from discovery.client import EtcdClient
from discovery.keys import load_prefix
from discovery.watch_cache import WatchCache
from proto.fleet_load import InstanceLoad, LoadFailure, decode_instance_load

__all__ = ["FleetLoads", "instance_id_of"]


def instance_id_of(key: str) -> int | None:
    """The instance id a load record's key ends with (``.../{id:x}``), None for another key."""
    try:
        return int(key.rsplit("/", 1)[-1], 16)
    except ValueError:
        return None


class FleetLoads:
    """The live load records of one namespace, by instance id (a worker without one: None)."""

    def __init__(self, cache: WatchCache[InstanceLoad]) -> None:
        self.cache = cache

    @classmethod
    async def start(cls, etcd: EtcdClient, namespace: str) -> FleetLoads:
        """List the records now (raises ``EtcdUnavailableError``) and follow them."""
        return cls(await WatchCache.start(etcd, load_prefix(namespace), decode_instance_load))

    async def aclose(self) -> None:
        """Stop following etcd."""
        await self.cache.aclose()

    def records(self) -> dict[int, InstanceLoad]:
        """Every live record by instance id."""
        found = {}
        for key, load in self.cache.items.items():
            instance_id = instance_id_of(key)
            if instance_id is not None:
                found[instance_id] = load
        return found

    def of(self, instance_id: int) -> InstanceLoad | None:
        """The record of ``instance_id``, or None when it publishes none (yet)."""
        return self.records().get(instance_id)

    def demand(self, adapter: str) -> float:
        """Requests per second for ``adapter`` across the fleet (the records' sum)."""
        return sum(load.demand.get(adapter, 0.0) for load in self.cache.items.values())

    def loading(self, adapter: str) -> list[int]:
        """Ids of the instances loading ``adapter`` now, sorted."""
        return sorted(i for i, load in self.records().items() if adapter in load.loading)

    def failures(self, adapter: str) -> dict[int, LoadFailure]:
        """The last failed load of ``adapter`` on each instance that lists one."""
        records = self.records().items()
        return {i: load.failed[adapter] for i, load in records if adapter in load.failed}
