"""Which model names are served, and by which instances, from two etcd watch caches.

A name is served while at least one instance with a live ``Instance`` record
has a card for it. The index is rebuilt lazily on the first read after any
change, so a request never waits on etcd and a burst of watch events costs
one rebuild.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from discovery.client import EtcdClient
from discovery.keys import card_prefix, instance_prefix, parse_card_key
from discovery.watch_cache import WatchCache
from proto.discovery import Instance, ModelDeploymentCard, decode_card, decode_instance

__all__ = ["ModelRegistry", "ServedModel", "build_index"]

DEFAULT_OWNER: Final = "lorafleet"


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A model name clients can ask for: its card and the instances that serve it."""

    name: str
    card: ModelDeploymentCard
    instances: tuple[Instance, ...]

    @property
    def parent(self) -> str | None:
        """The base model's name for an adapter, None for a base model."""
        return self.card.parent

    @property
    def root(self) -> str:
        """Where the weights come from: the adapter's URI or the base model's path."""
        lora = self.card.lora
        if lora is not None:
            return lora.uri or lora.local_path or self.name
        return self.card.source_path or self.name

    @property
    def created(self) -> int:
        """When the model was first served (the card's or else the earliest instance's time)."""
        return self.card.created or int(min(i.started_at for i in self.instances))


def _endpoint_path(instance: Instance) -> str:
    return f"{instance.namespace}/{instance.component}/{instance.endpoint}"


def build_index(
    instances: Mapping[str, Instance], cards: Mapping[str, ModelDeploymentCard]
) -> dict[str, ServedModel]:
    """Group cards by name, keeping those whose instance record is live; sorted by name."""
    live = {(_endpoint_path(i), i.instance_id): i for i in instances.values()}
    found: dict[str, tuple[ModelDeploymentCard, list[Instance]]] = {}
    for key, card in cards.items():
        try:
            path, instance_id, _slug = parse_card_key(key)
        except ValueError:
            continue
        instance = live.get((path, instance_id))
        if instance is None:
            continue
        entry = found.setdefault(card.display_name, (card, []))
        entry[1].append(instance)
    index = {}
    for name in sorted(found):
        card, serving = found[name]
        serving.sort(key=lambda i: i.instance_id)
        index[name] = ServedModel(name=name, card=card, instances=tuple(serving))
    return index


class ModelRegistry:
    """The served models of one namespace, following etcd through two watch caches."""

    def __init__(
        self,
        instances: WatchCache[Instance],
        cards: WatchCache[ModelDeploymentCard],
    ) -> None:
        self.instance_cache = instances
        self.card_cache = cards
        self._index: dict[str, ServedModel] = {}
        self._dirty = True
        self._unsubscribe: list[Callable[[], None]] = [
            instances.subscribe(self._changed),
            cards.subscribe(self._changed),
        ]

    @classmethod
    async def start(cls, etcd: EtcdClient, namespace: str) -> ModelRegistry:
        """List instances and cards of ``namespace`` and follow them (raises if etcd is down)."""
        instances = await WatchCache.start(etcd, instance_prefix(namespace), decode_instance)
        try:
            cards = await WatchCache.start(etcd, card_prefix(namespace), decode_card)
        except BaseException:
            await instances.aclose()
            raise
        return cls(instances, cards)

    async def __aenter__(self) -> ModelRegistry:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def get(self, name: str) -> ServedModel | None:
        """The served model called ``name``, or None."""
        return self._current().get(name)

    def models(self) -> list[ServedModel]:
        """Every served model, base models and adapters, sorted by name."""
        return list(self._current().values())

    def names(self) -> list[str]:
        """Every served name, sorted."""
        return list(self._current())

    def known(self, name: str) -> bool:
        """Whether any card in etcd names ``name``, live instance or not."""
        return any(card.display_name == name for card in self.card_cache.items.values())

    @property
    def instance_count(self) -> int:
        """How many instance records are live."""
        return len(self.instance_cache.items)

    async def aclose(self) -> None:
        """Stop following etcd."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        await self.instance_cache.aclose()
        await self.card_cache.aclose()

    def _changed(self, key: str, old: object, new: object) -> None:
        self._dirty = True

    def _current(self) -> dict[str, ServedModel]:
        if self._dirty:
            self._dirty = False
            self._index = build_index(self.instance_cache.items, self.card_cache.items)
        return self._index
