"""The fleet's desired adapters of one namespace: read from a watch cache, written to etcd.

Records live at ``v1/adapters/{namespace}/{lora_slug(name)}`` without a lease
(they outlive every process). Reads never touch etcd; writes wait until this
frontend's own cache shows them (``NamedRecords``), so a request right after
``POST /v1/adapters`` already finds the adapter.
"""

from __future__ import annotations

import structlog

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import adapter_key, adapters_prefix
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.frontend.named_records import NamedRecords
from lorafleet.proto.adapters import AdapterSpec, decode_adapter_spec, encode_adapter_spec

__all__ = ["DesiredState"]

log = structlog.get_logger(__name__)


class DesiredState(NamedRecords[AdapterSpec]):
    """Desired adapter specs by name, following ``adapters_prefix(namespace)``."""

    @classmethod
    async def start(cls, etcd: EtcdClient, namespace: str) -> DesiredState:
        """List the desired state now (raises ``EtcdUnavailableError``) and follow it."""
        cache = await WatchCache.start(etcd, adapters_prefix(namespace), decode_adapter_spec)
        return cls(etcd, namespace, cache, adapter_key)

    async def apply(self, spec: AdapterSpec) -> bool:
        """Store ``spec``; returns False when etcd already held exactly this spec."""
        key = self.key(spec.name)
        with self._etcd.errors("get", key):
            current = await self._etcd.get(key.encode())
        if current is not None and _decodes_to(current.value, spec):
            return False
        with self._etcd.errors("put", key):
            await self._etcd.put(key.encode(), encode_adapter_spec(spec))
        log.info("desired adapter stored", adapter=spec.name, base_model=spec.base_model,
                 replicas=spec.replicas, pinned=spec.pinned)  # fmt: skip
        await self._wait_for(key, spec)
        return True

    async def delete(self, name: str) -> bool:
        """Remove adapter ``name`` from the desired state; False if it was not there."""
        key = self.key(name)
        with self._etcd.errors("delete", key):
            deleted = await self._etcd.delete(key.encode())
        if deleted is None:
            return False
        log.info("desired adapter deleted", adapter=name)
        await self._wait_for(key, None)
        return True


def _decodes_to(raw: bytes, spec: AdapterSpec) -> bool:
    try:
        return decode_adapter_spec(raw) == spec
    except ValueError:  # msgspec's errors derive from ValueError: a broken record is replaced
        return False
