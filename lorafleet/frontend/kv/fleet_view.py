"""What the index may believe: the live instances and the versions each one's cards say.

The events listener asks it whether an event's instance and version are known (an event for
either unknown is dropped and counted), and it tells the index to forget an instance whose
record left etcd (its lease ended) and an instance's version whose card was retracted or
replaced (unload, eviction, swap), the moment the registry's watch caches see it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from lorafleet.discovery.keys import parse_card_key
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.fleet.kv_blocks import version_key
from lorafleet.frontend.card_view import CardView
from lorafleet.proto.discovery import Instance

__all__ = ["FleetView", "InstanceGone", "VersionGone"]

InstanceGone = Callable[[int], None]
"""Called with an instance id whose record left etcd."""
VersionGone = Callable[[int, str], None]
"""Called with an instance id and a version key it no longer serves."""


def _version(card: CardView) -> str:
    return version_key(card.name, card.digest)


def _instance_of(key: str) -> int | None:
    try:
        return parse_card_key(key)[1]
    except ValueError:
        return None


class FleetView:
    """Live instances by id and, per instance, the versions its cards name."""

    def __init__(
        self,
        instances: WatchCache[Instance],
        cards: WatchCache[CardView],
        *,
        instance_gone: InstanceGone,
        version_gone: VersionGone,
    ) -> None:
        self._instance_gone = instance_gone
        self._version_gone = version_gone
        self.instances: dict[int, Instance] = {}
        self._versions: dict[int, Counter[str]] = {}
        for key, instance in instances.items.items():
            self._instance_changed(key, None, instance)
        for key, card in cards.items.items():
            self._card_changed(key, None, card)
        self._unsubscribe = [
            instances.subscribe(self._instance_changed),
            cards.subscribe(self._card_changed),
        ]

    def close(self) -> None:
        """Stop following the watch caches."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()

    def serves(self, instance_id: int, version: str) -> bool:
        """Whether ``instance_id`` has a card of ``version`` now."""
        versions = self._versions.get(instance_id)
        return versions is not None and versions[version] > 0

    def _instance_changed(self, _key: str, old: Instance | None, new: Instance | None) -> None:
        if new is not None:
            self.instances[new.instance_id] = new
        elif old is not None and self.instances.pop(old.instance_id, None) is not None:
            self._instance_gone(old.instance_id)

    def _card_changed(self, key: str, old: CardView | None, new: CardView | None) -> None:
        instance_id = _instance_of(key)
        if instance_id is None:
            return
        versions = self._versions.setdefault(instance_id, Counter())
        if new is not None:
            versions[_version(new)] += 1
        if old is not None:
            gone = _version(old)
            versions[gone] -= 1
            if versions[gone] <= 0:
                del versions[gone]
                self._version_gone(instance_id, gone)
        if not versions:
            del self._versions[instance_id]
