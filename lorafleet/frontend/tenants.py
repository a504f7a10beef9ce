"""Tenants, API keys and this frontend's share of their limits: who is calling, may they use
this model, are they within their limits.

Follows three etcd prefixes (``discovery.keys``): the tenants, the keys (by their sha256)
and the live frontends (each one's presence under its lease, this one's included).
While no tenant and no key exists the OpenAI routes are open, as before tenants existed;
the first tenant or key closes them (so revoking the last key leaves them closed). A
revoked key is a deleted record: every frontend's watch drops it within etcd's watch
latency (milliseconds), so it is refused everywhere within a second.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Final

import msgspec
import structlog

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import (
    api_key_key,
    api_keys_prefix,
    frontend_key,
    frontends_prefix,
    tenant_key,
    tenants_prefix,
)
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.frontend.access_log import RequestRecord
from lorafleet.frontend.errors import ModelNotFoundError
from lorafleet.frontend.metrics import FrontendMetrics
from lorafleet.frontend.named_records import synced
from lorafleet.frontend.quotas import TenantQuota
from lorafleet.proto.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    RateLimitedError,
    UnauthorizedError,
)
from lorafleet.proto.tenants import (
    API_KEY_PREFIX,
    ApiKeyCreated,
    ApiKeyRecord,
    ApiKeyView,
    FrontendPresence,
    Tenant,
    decode_api_key,
    decode_presence,
    decode_tenant,
    key_hash,
    key_id,
    may_use,
)

__all__ = [
    "Permit",
    "TenantGate",
]

log = structlog.get_logger(__name__)

KEY_BYTES: Final = 32
_BEARER: Final = "Bearer "


class Permit:
    """One admitted request of a tenant: ``release`` it when the request ends, or
    ``withdraw`` it when the request never runs."""

    __slots__ = ("_gate", "priority", "tenant")

    def __init__(self, gate: TenantGate | None, tenant: str, priority: int = 0) -> None:
        self._gate = gate
        self.tenant = tenant
        self.priority = priority
        """The tenant's priority: who is served first while the fleet is saturated."""

    def release(self, record: RequestRecord, status: int) -> None:
        """Give back the concurrency slot and count the tokens and TTFT the request used."""
        if self._gate is not None:
            self._gate.released(self.tenant, record, status)

    def withdraw(self, refused_by: str | None) -> None:
        """The request will not run: give back its concurrency slot, counting a refusal by
        ``refused_by`` (e.g. ``saturated``) unless None (the client left)."""
        if self._gate is not None:
            self._gate.withdrawn(self.tenant, refused_by)


OPEN: Final = Permit(None, "")
"""The permit of every request while the routes are open: nothing to count."""


class TenantGate:
    """The tenants and keys of one namespace, and this frontend's share of their limits."""

    def __init__(
        self, etcd: EtcdClient, namespace: str, metrics: FrontendMetrics, *,
        tenants: WatchCache[Tenant], keys: WatchCache[ApiKeyRecord],
        frontends: WatchCache[FrontendPresence],
    ) -> None:  # fmt: skip
        self._etcd = etcd
        self.namespace = namespace
        self._metrics = metrics
        self._tenants = tenants
        self._keys = keys
        self._frontends = frontends
        self._quotas: dict[str, TenantQuota] = {}

    @classmethod
    async def start(
        cls, etcd: EtcdClient, namespace: str, lease: LeaseKeeper, metrics: FrontendMetrics
    ) -> TenantGate:
        """Follow tenants, keys and frontends, and mark this frontend live under ``lease``
        (the frontend's; its owner revokes it, and the mark goes with it)."""
        tenants = await WatchCache.start(etcd, tenants_prefix(namespace), decode_tenant)
        keys = await WatchCache.start(
            etcd, api_keys_prefix(namespace), decode_api_key, hide_keys=True
        )  # a key's etcd name is its hash: never logged
        frontends = await WatchCache.start(etcd, frontends_prefix(namespace), decode_presence)
        presence = FrontendPresence(started=int(time.time()))
        await lease.put(frontend_key(namespace, os.urandom(6).hex()), msgspec.json.encode(presence))
        gate = cls(etcd, namespace, metrics, tenants=tenants, keys=keys, frontends=frontends)
        if not gate.keyed:
            log.warning("no tenant or API key exists: the OpenAI routes are open to anyone")
        return gate

    async def aclose(self) -> None:
        """Stop following etcd."""
        for cache in (self._tenants, self._keys, self._frontends):
            await cache.aclose()

    @property
    def keyed(self) -> bool:
        """True once any tenant or API key exists: every OpenAI request then needs a key."""
        return bool(self._keys.items or self._tenants.items)

    @property
    def share(self) -> int:
        """How many live frontends divide every tenant's limits (this one at least)."""
        return max(1, len(self._frontends.items))

    def identify(self, authorization: str | None) -> Tenant | None:
        """The caller's tenant; None while the routes are open (``keyed``). Raises
        ``UnauthorizedError``."""
        if not self.keyed:
            return None
        header = authorization or ""
        key = header.removeprefix(_BEARER) if header.startswith(_BEARER) else ""
        record = self._keys.items.get(api_key_key(self.namespace, key_hash(key))) if key else None
        tenant = None if record is None else self.tenant(record.tenant)
        if tenant is None:
            raise UnauthorizedError(
                "this frontend needs 'Authorization: Bearer <API key>'; the key sent is missing, "
                "unknown or revoked (an operator makes keys with 'lorafleet keys create')"
            )
        return tenant

    def tenant(self, name: str) -> Tenant | None:
        """Tenant ``name``, or None."""
        return self._tenants.items.get(tenant_key(self.namespace, name))

    def admit(
        self, tenant: Tenant | None, model: str, served: Callable[[], Iterable[str]]
    ) -> Permit:
        """Let one request of ``tenant`` for ``model`` through, or raise.

        A model the tenant may not use is answered as one that does not exist (404, listing
        only the tenant's models), so names of other teams' adapters do not leak.
        """
        if tenant is None:
            return OPEN
        if not may_use(tenant, model):
            self._metrics.tenant_refused(tenant.name, "model")
            raise ModelNotFoundError(model, self.visible(tenant, served()))
        quota = self._quota(tenant)
        try:
            quota.admit()
        except RateLimitedError as exc:
            self._metrics.tenant_refused(tenant.name, str(exc.fields["limit"]))
            raise
        return Permit(self, tenant.name, tenant.priority)

    def visible(self, tenant: Tenant | None, names: Iterable[str]) -> list[str]:
        """The ``names`` the tenant may use (all of them while the routes are open)."""
        return list(names) if tenant is None else [n for n in names if may_use(tenant, n)]

    def released(self, name: str, record: RequestRecord, status: int) -> None:
        """An admitted request of tenant ``name`` ended (``Permit.release``)."""
        tokens = record.prompt_tokens + record.completion_tokens
        quota = self._quotas.get(name)
        if quota is not None:
            quota.release(tokens)
        self._metrics.tenant_answered(name, status, tokens, record.first_token_s)

    def withdrawn(self, name: str, refused_by: str | None) -> None:
        """An admitted request of tenant ``name`` will not run (``Permit.withdraw``)."""
        quota = self._quotas.get(name)
        if quota is not None:
            quota.release(0)
        if refused_by is not None:
            self._metrics.tenant_refused(name, refused_by)

    def _quota(self, tenant: Tenant) -> TenantQuota:
        """The tenant's quota, rebuilt when its limits or the number of frontends change."""
        quota = self._quotas.get(tenant.name)
        share = self.share
        if quota is None or quota.tenant != tenant or quota.share != share:
            fresh = TenantQuota(tenant, share)
            fresh.inflight = 0 if quota is None else quota.inflight
            self._quotas[tenant.name] = quota = fresh
        return quota

    # Admin writes: persistent records, seen by this frontend before the answer goes.

    def tenants(self) -> list[Tenant]:
        """Every tenant, by name."""
        return sorted(self._tenants.items.values(), key=lambda tenant: tenant.name)

    async def put_tenant(self, tenant: Tenant) -> Tenant:
        """Create or replace a tenant; creating one is refused while keys of a deleted tenant
        of that name are left, which the new tenant would otherwise let in again."""
        if self.tenant(tenant.name) is None:
            left = self._key_ids_of(tenant.name)
            if left:
                raise ConflictError(
                    f"keys {left} of an earlier tenant {tenant.name!r} are left; revoke them "
                    "first (lorafleet keys revoke ID): a new tenant must not inherit them"
                )
        key = tenant_key(self.namespace, tenant.name)
        with self._etcd.errors("put", key):
            await self._etcd.put(key.encode(), msgspec.json.encode(tenant))
        log.info("tenant stored", tenant=tenant.name, models=tenant.models)
        await synced(self._tenants, lambda items: items.get(key) == tenant)
        return tenant

    async def delete_tenant(self, name: str) -> None:
        """Delete a tenant; refused while keys of it exist (revoke them first)."""
        if self.tenant(name) is None:
            raise NotFoundError(f"tenant {name!r} does not exist")
        held = self._key_ids_of(name)
        if held:
            raise ConflictError(f"tenant {name!r} still has keys {held}; revoke them first")
        key = tenant_key(self.namespace, name)
        with self._etcd.errors("delete", key):
            await self._etcd.delete(key.encode())
        await synced(self._tenants, lambda items: key not in items)

    async def create_key(self, tenant: str, note: str) -> ApiKeyCreated:
        """Make a key for ``tenant``: stored as its hash, the key itself answered once."""
        if self.tenant(tenant) is None:
            raise InvalidRequestError(f"tenant {tenant!r} does not exist; create it first",
                                      param="tenant")  # fmt: skip
        key = API_KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)
        hashed = key_hash(key)
        record = ApiKeyRecord(tenant=tenant, created=int(time.time()), note=note)
        etcd_key = api_key_key(self.namespace, hashed)
        with self._etcd.errors("put", api_keys_prefix(self.namespace)):  # no hash in errors
            await self._etcd.put(etcd_key.encode(), msgspec.json.encode(record))
        log.info("API key created", tenant=tenant)  # neither the key nor its hash or id
        await synced(self._keys, lambda items: etcd_key in items)
        return ApiKeyCreated(key=key, id=key_id(hashed), tenant=tenant)

    def key_views(self) -> list[ApiKeyView]:
        """Every key by tenant and id (never the key: only its hash is known)."""
        views = [
            ApiKeyView(id=key_id(hashed), tenant=r.tenant, created=r.created, note=r.note)
            for hashed, r in self._hashed_keys().items()
        ]
        return sorted(views, key=lambda view: (view.tenant, view.id))

    async def revoke_key(self, wanted: str) -> None:
        """Delete the key whose id is ``wanted``: refused on every frontend from then on."""
        found = [(h, record) for h, record in self._hashed_keys().items() if key_id(h) == wanted]
        if not found:
            raise NotFoundError(f"no API key has id {wanted!r}; 'lorafleet keys list' shows them")
        hashed, record = found[0]
        etcd_key = api_key_key(self.namespace, hashed)
        with self._etcd.errors("delete", api_keys_prefix(self.namespace)):
            await self._etcd.delete(etcd_key.encode())
        log.info("API key revoked", tenant=record.tenant)
        await synced(self._keys, lambda items: etcd_key not in items)

    def _key_ids_of(self, tenant: str) -> list[str]:
        """The ids of every key of ``tenant``."""
        return sorted(
            key_id(h) for h, record in self._hashed_keys().items() if record.tenant == tenant
        )

    def _hashed_keys(self) -> dict[str, ApiKeyRecord]:
        prefix = api_keys_prefix(self.namespace)
        return {k.removeprefix(prefix): record for k, record in self._keys.items.items()}
