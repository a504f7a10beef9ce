"""The fleet's aliases of one namespace: read from a watch cache, split per request, written
with a compare-and-swap on the record's revision.

Records live at ``v1/aliases/{namespace}/{lora_slug(name)}`` without a lease. Every write
(admin routes, a frontend's rollout decision) reads the record and its revision, changes
it, and puts it only if the revision is unchanged, so two frontends judging the same
window cannot both win. Writes wait until this frontend's cache shows them
(``NamedRecords``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Final, TypeAlias

import structlog

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import alias_key, aliases_prefix
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.frontend.named_records import NamedRecords
from lorafleet.proto.aliases import Alias, AliasTarget, decode_alias, encode_alias
from lorafleet.proto.errors import ConflictError

__all__ = ["AliasBook", "Change", "choose", "session_point"]

log = structlog.get_logger(__name__)

CAS_ATTEMPTS: Final = 5
"""Tries of one read-change-swap before a write gives up with a 409 (others kept winning)."""
POINTS: Final = 10_000

Change: TypeAlias = Callable[[Alias | None], Alias | None]
"""Turns the stored alias (None: absent) into the one to store (None: delete it); raises
a ``LorafleetError`` to refuse, which leaves etcd unchanged."""


def session_point(alias: str, session: str) -> float:
    """Where ``session`` falls in ``[0, 100)`` for ``alias``: the same place every time."""
    digest = hashlib.blake2b(f"{alias}\0{session}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % POINTS * 100 / POINTS


def choose(alias: str, targets: list[AliasTarget], session: str) -> str:
    """The target for one request: by the session's point when there is one, else at random."""
    point = session_point(alias, session) if session else random.random() * 100
    upto = 0
    for target in targets:
        upto += target.weight
        if point < upto:
            return target.model
    return targets[-1].model


class AliasBook(NamedRecords[Alias]):
    """Aliases by name, following ``aliases_prefix(namespace)``."""

    @classmethod
    async def start(cls, etcd: EtcdClient, namespace: str) -> AliasBook:
        """List the aliases now (raises ``EtcdUnavailableError``) and follow them."""
        cache = await WatchCache.start(etcd, aliases_prefix(namespace), decode_alias)
        return cls(etcd, namespace, cache, alias_key)

    def pick(self, name: str, session: str) -> str | None:
        """The version that answers a request for ``name``; None when ``name`` is no alias."""
        if not self.cache.items:  # the usual case costs one check
            return None
        alias = self.get(name)
        return None if alias is None else choose(name, alias.targets, session)

    async def update(self, name: str, change: Change) -> Alias | None:
        """Apply ``change`` to alias ``name`` with a compare-and-swap; the stored result."""
        key = self.key(name)
        for _attempt in range(CAS_ATTEMPTS):
            with self._etcd.errors("get", key):
                current = await self._etcd.get(key.encode())
            revision = 0 if current is None else current.mod_revision
            old = None if current is None else _decoded(current.value)
            new = change(old)
            if new == old:
                return new
            if await self._swap(key, revision, new):
                log.info("alias stored", alias=name, targets=_targets(new))
                await self._wait_for(key, new)
                return new
        raise ConflictError(f"alias {name!r} kept changing under this write; try again")

    async def _swap(self, key: str, revision: int, new: Alias | None) -> bool:
        txn = self._etcd.transactions
        write = (
            txn.delete(key.encode()) if new is None else txn.put(key.encode(), encode_alias(new))
        )
        with self._etcd.errors("transaction", key):
            swapped, _ = await self._etcd.transaction(
                compare=[txn.mod(key.encode()) == revision], success=[write], failure=[]
            )
        return bool(swapped)


def _decoded(raw: bytes) -> Alias | None:
    try:
        return decode_alias(raw)
    except ValueError:  # a broken record is replaced
        return None


def _targets(alias: Alias | None) -> str:
    return "-" if alias is None else ", ".join(f"{t.model}:{t.weight}" for t in alias.targets)
