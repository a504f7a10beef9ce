"""Which model names are served, and by which instances, from two etcd watch caches.

A name is served while at least one instance with a live ``Instance`` record
has a card for it. Watch events only mark the names they touch as stale; the
first read after a change refreshes those names alone, so a request never
waits on etcd, a burst of events costs one refresh, and one adapter loaded
among thousands costs one entry, not a rebuild: the sorted order is kept by
bisection (no re-sort), and answers built from every model (``each``,
``joined``) are rebuilt only from entries of the names that changed.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, TypeVar

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import card_prefix, endpoint_path, instance_prefix, parse_card_key
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.frontend.card_view import CardView, decode_card_view
from lorafleet.proto.discovery import Instance, decode_instance

__all__ = ["ModelRegistry", "ServedModel", "build_index"]

DEFAULT_OWNER: Final = "lorafleet"
BISECT_MAX_NAMES: Final = 64
"""More names added in one refresh than this: sort the order once instead of inserting each."""

_T = TypeVar("_T")
_MISSING: Final = object()
_Owner: TypeAlias = tuple[str, int]
"""An instance as card keys name it: ``namespace/component/endpoint`` and its id."""
_Filed: TypeAlias = tuple[str, _Owner, CardView]
"""A card as the registry files it under its name: its key, its instance, the card."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A model name clients can ask for: its card and the instances that serve it."""

    name: str
    card: CardView
    instances: tuple[Instance, ...]

    @property
    def parent(self) -> str | None:
        """The base model's name for an adapter, None for a base model."""
        return self.card.parent

    @property
    def root(self) -> str:
        """Where the weights come from (the adapter's URI, the base model's path or hub id),
        as anyone may see it: no secrets, no paths on a worker's disk (``public_uri``)."""
        return self.card.root

    @property
    def created(self) -> int:
        """When the model was first served (the card's or else the earliest instance's time)."""
        return self.card.created or int(min(i.started_at for i in self.instances))


def _endpoint_path(instance: Instance) -> str:
    return endpoint_path(instance.namespace, instance.component, instance.endpoint)


def _owner(instance: Instance) -> _Owner:
    return _endpoint_path(instance), instance.instance_id


def build_index(
    instances: Mapping[str, Instance], cards: Mapping[str, CardView]
) -> dict[str, ServedModel]:
    """Group cards by name, keeping those whose instance record is live; sorted by name.

    The whole index at once: ``ModelRegistry`` keeps the same index up to date
    change by change.
    """
    live = {(_endpoint_path(i), i.instance_id): i for i in instances.values()}
    found: dict[str, tuple[CardView, list[Instance]]] = {}
    for key, card in cards.items():
        try:
            path, instance_id, _slug = parse_card_key(key)
        except ValueError:
            continue
        instance = live.get((path, instance_id))
        if instance is None:
            continue
        entry = found.setdefault(card.name, (card, []))
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
        cards: WatchCache[CardView],
    ) -> None:
        self.instance_cache = instances
        self.card_cache = cards
        self._live: dict[_Owner, tuple[Instance]] = {}
        """Each live instance, as a tuple of one: the ``instances`` of every name it alone
        serves (most adapters), shared instead of one tuple per name."""
        self._cards: dict[str, tuple[_Filed, ...]] = {}
        """Every card by name, in the order they came (most names have one: a tuple is the
        smallest container), with its key and the instance its key names."""
        self._cards_on: dict[str, dict[int, CardView]] = {}
        """``cards_on``'s answers, by name, until that name's cards change."""
        self._names_on: dict[_Owner, Counter[str]] = {}
        self._owners: dict[_Owner, _Owner] = {}
        """One owner tuple per instance with cards, shared by all its cards (the keys of
        ``_names_on``, which has no way to return its own key)."""
        self._index: dict[str, ServedModel] = {}
        self._order: list[str] = []
        """The keys of ``_index``, sorted (``_index`` itself is in no order)."""
        self._version = 0
        self._stale: set[str] = set()
        self._memos: dict[Callable[[ServedModel], Any], dict[str, Any]] = {}
        self._lists: dict[Callable[[ServedModel], Any], list[Any]] = {}
        self._joined: dict[tuple[Callable[[ServedModel], bytes], bytes, bytes], bytes] = {}
        for key, instance in instances.items.items():
            self._instance_changed(key, None, instance)
        for key, card in cards.items.items():
            self._card_changed(key, None, card)
        self._unsubscribe: list[Callable[[], None]] = [
            instances.subscribe(self._instance_changed),
            cards.subscribe(self._card_changed),
        ]

    @classmethod
    async def start(cls, etcd: EtcdClient, namespace: str) -> ModelRegistry:
        """List instances and cards of ``namespace`` and follow them (raises if etcd is down)."""
        instances = await WatchCache.start(etcd, instance_prefix(namespace), decode_instance)
        try:
            cards = await WatchCache.start(etcd, card_prefix(namespace), decode_card_view)
        except BaseException:
            await instances.aclose()
            raise
        return cls(instances, cards)

    async def __aenter__(self) -> ModelRegistry:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def etcd_in_sync(self) -> bool:
        """Whether instances and cards follow etcd now (False: the last view is served)."""
        return self.instance_cache.in_sync and self.card_cache.in_sync

    def get(self, name: str) -> ServedModel | None:
        """The served model called ``name``, or None."""
        return self._current().get(name)

    def card_on(self, name: str, instance_id: int) -> CardView | None:
        """The card that instance ``instance_id`` published for ``name``, or None."""
        return self.cards_on(name).get(instance_id)

    def cards_on(self, name: str) -> Mapping[int, CardView]:
        """The card each instance published for ``name``, by instance id (the first one filed).

        Built once per change of ``name``'s cards: a router asks it for every candidate of
        every request, and a scan of the name's cards each time cost O(instances²) per
        request for a base model many instances serve."""
        if (on := self._cards_on.get(name)) is None:
            if name not in self._cards:
                return {}  # not kept: names asked about and never filed would pile up
            on = self._cards_on[name] = {}
            for _key, (_path, owner_id), card in self._cards[name]:
                on.setdefault(owner_id, card)
        return on

    def models(self) -> list[ServedModel]:
        """Every served model, base models and adapters, sorted by name."""
        index = self._current()
        return [index[name] for name in self._order]

    def each(self, build: Callable[[ServedModel], _T]) -> list[_T]:
        """``[build(m) for m in self.models()]``, calling ``build`` again only for changed models.

        For answers made of every model (``/v1/models``), so that asking again
        costs nothing until a worker changes what it serves.
        """
        return list(self._built(build))

    def joined(
        self, build: Callable[[ServedModel], bytes], *, head: bytes = b"", tail: bytes = b""
    ) -> bytes:
        """``head + b",".join(self.each(build)) + tail``, kept until a worker changes what
        it serves.

        For pre-encoded answers made of every model: asking again costs nothing, not
        even a copy (``head`` and ``tail`` make it the whole body), and a change costs
        one ``build`` per changed model and one join.
        """
        self._current()
        key = (build, head, tail)
        body = self._joined.get(key)
        if body is None:
            body = self._joined[key] = b"".join((head, b",".join(self._built(build)), tail))
        return body

    def version(self) -> int:
        """A number that changes whenever the served models do (to key caches built on them)."""
        self._current()
        return self._version

    def names(self) -> list[str]:
        """Every served name, sorted."""
        self._current()
        return list(self._order)

    def first_names(self, count: int) -> list[str]:
        """The first ``count`` served names, sorted (without copying every name)."""
        self._current()
        return self._order[:count]

    def count(self) -> int:
        """How many names are served."""
        return len(self._current())

    def known(self, name: str) -> bool:
        """Whether any card in etcd names ``name``, live instance or not."""
        return name in self._cards

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

    def _instance_changed(self, key: str, old: Instance | None, new: Instance | None) -> None:
        """Mark the names served by the instance stale and note whether it is live."""
        for record in (old, new):
            if record is not None:
                self._stale.update(self._names_on.get(_owner(record), ()))
        if old is not None:
            self._live.pop(_owner(old), None)
        if new is not None:
            self._live[_owner(new)] = (new,)

    def _card_changed(self, key: str, old: CardView | None, new: CardView | None) -> None:
        """File the card under its name and its instance; mark its name(s) stale."""
        try:
            path, instance_id, _slug = parse_card_key(key)
        except ValueError:
            return
        owner = self._owners.setdefault((path, instance_id), (path, instance_id))
        if old is not None and new is not None and old.name == new.name:
            filed = self._cards[new.name]  # in place: keeps its rank
            self._cards[new.name] = tuple((k, o, new if k == key else c) for k, o, c in filed)
            self._cards_on.pop(new.name, None)
            self._stale.add(new.name)
            return
        if old is not None:
            self._forget_card(key, owner, old.name)
        if new is not None:
            self._cards[new.name] = (*self._cards.get(new.name, ()), (key, owner, new))
            self._cards_on.pop(new.name, None)
            self._names_on.setdefault(owner, Counter())[new.name] += 1
            self._stale.add(new.name)

    def _forget_card(self, key: str, owner: _Owner, name: str) -> None:
        filed = tuple(entry for entry in self._cards.get(name, ()) if entry[0] != key)
        if filed:
            self._cards[name] = filed
        else:
            self._cards.pop(name, None)
        self._cards_on.pop(name, None)
        names = self._names_on.get(owner)
        if names is not None:
            names[name] -= 1
            if names[name] <= 0:
                del names[name]
            if not names:
                del self._names_on[owner]
        if owner not in self._names_on:
            self._owners.pop(owner, None)
        self._stale.add(name)

    def _current(self) -> dict[str, ServedModel]:
        if self._stale:
            self._refresh()
        return self._index

    def _refresh(self) -> None:
        """Recompute the stale names' entries, keeping ``_order`` sorted by bisection
        (or by one sort when many names came at once, as on start-up)."""
        added = []
        for name in self._stale:
            served = self._served(name)
            if served is None:
                if self._index.pop(name, None) is not None:
                    del self._order[bisect_left(self._order, name)]
            else:
                if name not in self._index:
                    added.append(name)
                self._index[name] = served
            for memo in self._memos.values():
                memo.pop(name, None)
        if len(added) > BISECT_MAX_NAMES:
            self._order = sorted(self._index)
        else:
            for name in added:
                insort(self._order, name)
        self._stale.clear()
        self._lists.clear()
        self._joined.clear()
        self._version += 1

    def _built(self, build: Callable[[ServedModel], _T]) -> list[_T]:
        """``build`` of every model in name order, from its memo where the model is unchanged."""
        index = self._current()
        built = self._lists.get(build)
        if built is None:
            memo = self._memos.setdefault(build, {})
            built = []
            for name in self._order:
                entry = memo.get(name, _MISSING)
                if entry is _MISSING:
                    entry = memo[name] = build(index[name])
                built.append(entry)
            self._lists[build] = built
        return built

    def _served(self, name: str) -> ServedModel | None:
        """``name``'s entry: its first card on a live instance and every live instance with one."""
        card: CardView | None = None
        serving: list[tuple[Instance]] = []
        for _key, owner, candidate in self._cards.get(name, ()):
            alone = self._live.get(owner)
            if alone is not None:
                card = candidate if card is None else card
                serving.append(alone)
        if card is None:
            return None
        if len(serving) == 1:
            return ServedModel(name=name, card=card, instances=serving[0])
        instances = sorted((instance for (instance,) in serving), key=lambda i: i.instance_id)
        return ServedModel(name=name, card=card, instances=tuple(instances))
