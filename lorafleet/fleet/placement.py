"""Where adapters go: rendezvous hashing with bounded loads, and copies from demand; pure.

Every worker computes the same plan from the same etcd view, so no coordinator
is needed. Rendezvous (highest random weight) order keeps placement stable:
when an instance comes or goes, only the adapters that ranked it among their
chosen ones move. Bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent
Hashing with Bounded Loads", 2018) skip an instance that is full or holds more
than ``ceil((1 + eps) * copies / instances)`` copies, so no instance is left
empty while another overflows. Given the adapters' demand, the same bound applies to
demand too: each copy carries its share of its adapter's requests, and an instance takes
a new copy only while its share stays within ``1 + eps`` of its fair one (weighted
bounded loads), so two popular adapters do not land on one instance. No I/O here:
``bench`` times these functions.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from typing import Final, Literal

import blake3

__all__ = [
    "HELD_DEMAND_EPS",
    "IN_USE_RPS",
    "LOAD_BOUND_EPS",
    "RendezvousCache",
    "chosen_instances",
    "may_drop_copy",
    "plan_copies",
    "rendezvous_order",
    "wanted_copies",
]

LOAD_BOUND_EPS: Final = 0.25
"""Bounded loads' epsilon: an instance holds at most 1.25 times its fair share of copies,
and takes a new copy only while its demand stays within 1.25 times its fair share."""
HELD_DEMAND_EPS: Final = 0.5
"""A copy already held stays while its instance's demand is within 1.5 times its fair
share: moving a copy costs a load, so held copies get more room than new ones, and demand's
noise does not move them back and forth."""
PREFETCH_FRACTION: Final = 0.7
"""Add a copy once demand per copy passes this share of the per-copy threshold (prefetch)."""
DROP_FRACTION: Final = 0.5
"""Drop a copy only when one fewer would each see less than this share (hysteresis)."""
_MAX_LOGGED_CHANGES: Final = 64
"""Instance-set changes ``RendezvousCache`` keeps for orders not asked for since; an order
older than that is rebuilt (100 weights and a sort) when next asked for."""
IN_USE_RPS: Final = 0.1
"""Fleet demand below this is a trickle: such an adapter is never "in use" (eviction keeps
no slot for it), and evicting one costs about the same as evicting another."""


_MASK_64: Final = (1 << 64) - 1


def _key(text: str) -> int:
    """A 64-bit hash of ``text``; computed once per adapter and once per instance."""
    return int.from_bytes(blake3.blake3(text.encode()).digest()[:8], "big")


def _mix(x: int) -> int:
    """SplitMix64's finaliser: a pair's weight from its two keys, 5x cheaper than hashing."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK_64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK_64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK_64
    return x ^ (x >> 31)


def _rank(weight: int, instance_id: int) -> int:
    """One int that sorts ascending as (weight, id) descending: cheaper to compare than a tuple."""
    return ((_MASK_64 - weight) << 64) | (_MASK_64 - instance_id)


def _ranked_id(rank: int) -> int:
    return _MASK_64 - (rank & _MASK_64)


def _ranks(adapter_key: int, instances: Iterable[tuple[int, int]]) -> list[int]:
    """The ``_rank``s of ``instances`` (id, ``_key`` of its hex id) for the adapter whose
    ``_key`` is ``adapter_key``, best first: the one ranking of rendezvous hashing."""
    return sorted(_rank(_mix(adapter_key ^ key), iid) for iid, key in instances)


def rendezvous_order(adapter: str, instance_ids: Iterable[int]) -> list[int]:
    """Instances ranked for ``adapter``, best first (ties broken by id)."""
    keyed = ((iid, _key(f"{iid:x}")) for iid in set(instance_ids))
    return [_ranked_id(rank) for rank in _ranks(_key(adapter), keyed)]


def chosen_instances(
    adapter: str, replicas: int | Literal["all"], instance_ids: Iterable[int]
) -> list[int]:
    """The instances that should hold ``adapter``: the first ``replicas`` of its order."""
    order = rendezvous_order(adapter, instance_ids)
    return order if replicas == "all" else order[: max(replicas, 0)]


def wanted_copies(demand_rps: float, *, copy_rps: float) -> int:
    """Copies that keep each copy's share of ``demand_rps`` below the prefetch threshold.

    The threshold is ``PREFETCH_FRACTION * copy_rps``: the next copy is loaded before the
    current ones reach ``copy_rps``, so it is warm when they saturate.
    """
    if demand_rps <= 0:
        return 0
    return math.ceil(demand_rps / (PREFETCH_FRACTION * copy_rps))


def may_drop_copy(demand_rps: float, copies: int, *, copy_rps: float) -> bool:
    """Whether ``copies - 1`` copies would each see at most ``DROP_FRACTION * copy_rps``."""
    return copies > 0 and demand_rps <= DROP_FRACTION * copy_rps * (copies - 1)


class RendezvousCache:
    """Rendezvous orders over one instance set, updated by difference when the set changes.

    A weight is computed once per (adapter, instance), and lazily: a changed instance set
    is logged, and an adapter's order catches up with the log only when it is asked for
    (one hash and one insertion per instance that came or went). A placement pass asks
    only for the orders of adapters short of copies, so an instance that joins or leaves
    costs the adapters it touches, not a re-ranking of every adapter.

    Example::

        cache = RendezvousCache()
        cache.set_instances([1, 2, 3])
        cache.order("pirate")  # same as rendezvous_order("pirate", [1, 2, 3])
    """

    def __init__(self) -> None:
        self._instances: dict[int, int] = {}
        """Instance -> its key (``_key`` of its hex id)."""
        self._changes: list[tuple[dict[int, int], dict[int, int]]] = []
        """The instances each ``set_instances`` added and removed (id -> key), oldest first."""
        self._first_change = 0
        """The number of ``_changes[0]``: older changes are dropped (``_MAX_LOGGED_CHANGES``)."""
        self._ranked: dict[str, tuple[int, int, list[int]]] = {}
        """Adapter -> (its key, the changes applied to it, ``_rank``s ascending: best first)."""

    def set_instances(self, instance_ids: Iterable[int]) -> None:
        """Follow a new instance set: log the instances that came and went."""
        new = set(instance_ids)
        added = {iid: _key(f"{iid:x}") for iid in new if iid not in self._instances}
        removed = {iid: key for iid, key in self._instances.items() if iid not in new}
        if not added and not removed:
            return
        for iid in removed:
            del self._instances[iid]
        self._instances |= added
        self._changes.append((added, removed))
        if len(self._changes) > _MAX_LOGGED_CHANGES:  # orders older than the log are rebuilt
            del self._changes[0]
            self._first_change += 1

    def retain(self, adapters: Collection[str]) -> None:
        """Forget the orders of adapters not in ``adapters`` (deleted from the desired state)."""
        for adapter in [name for name in self._ranked if name not in adapters]:
            del self._ranked[adapter]

    def order(self, adapter: str) -> list[int]:
        """The instances ranked for ``adapter``, best first."""
        return [_ranked_id(rank) for rank in self._ranked_entries(adapter)]

    def _ranked_entries(self, adapter: str) -> list[int]:
        now = self._first_change + len(self._changes)
        cached = self._ranked.get(adapter)
        if cached is not None and cached[1] == now:
            return cached[2]
        if cached is None or cached[1] < self._first_change:
            adapter_key = _key(adapter)
            ranked = _ranks(adapter_key, self._instances.items())
        else:
            adapter_key, applied, ranked = cached
            for added, removed in self._changes[applied - self._first_change :]:
                for iid, key in removed.items():
                    del ranked[bisect.bisect_left(ranked, _rank(_mix(adapter_key ^ key), iid))]
                for iid, key in added.items():
                    bisect.insort(ranked, _rank(_mix(adapter_key ^ key), iid))
        self._ranked[adapter] = (adapter_key, now, ranked)
        return ranked


def plan_copies(
    copies: Mapping[str, int],
    slots: Mapping[int, int],
    *,
    held: Mapping[int, Collection[str]] | None = None,
    demand: Mapping[str, float] | None = None,
    eps: float = LOAD_BOUND_EPS,
    cache: RendezvousCache | None = None,
    allowed: Mapping[str, Collection[int]] | None = None,
) -> dict[str, list[int]]:
    """Place ``copies[adapter]`` copies of each adapter on the instances of ``slots``.

    Args:
        copies: adapter name -> copies wanted (0: none placed; more than the instances:
            one per instance).
        slots: instance id -> adapter slots it has (its ``max_loras``).
        held: instance id -> adapters it holds now (cards and loads in progress). A copy
            already held stays where it is while the bound allows (no thrash); held adapters
            with no copies wanted take their slot (placement does not evict them).
        demand: adapter -> its requests per second across the fleet (None: placed by count
            alone). A copy carries ``demand / copies``; an instance takes a new copy while
            its demand stays within ``1 + eps`` of its fair share by slots, keeps a held one
            within ``1 + HELD_DEMAND_EPS``, and takes any copy while it has no demand yet;
            only when no instance with room passes that does a copy go past it.
        eps: an instance gets at most ``ceil((1 + eps) * total * slots_i / all_slots)``
            copies (bounded loads; equal slots: ``ceil((1 + eps) * total / instances)``).
        cache: rendezvous orders kept between calls (``set_instances`` is called here).
        allowed: adapter -> the only instances that can take it (``fleet.adapter_fit``: its
            rank against theirs); an adapter not named here may go anywhere. Its copies are
            at most as many as those instances, and held copies elsewhere are not kept.

    Returns:
        adapter -> the instances that should hold it (kept holders first, then rendezvous
        order); adapters with copies wanted only. An adapter gets fewer copies than wanted
        only when no instance with room is left. Adapters are taken busiest copy first,
        then by name, so every caller with the same view gets the same plan.
    """
    held = held or {}
    cache = cache or RendezvousCache()
    cache.set_instances(slots)
    only = {name: set(iids) & slots.keys() for name, iids in (allowed or {}).items()}
    wanted = {name: min(n, len(only.get(name, slots))) for name, n in copies.items()}
    wanted = {name: n for name, n in wanted.items() if n > 0}
    room = _room(wanted, slots, held, eps)
    bound = _DemandBound(wanted, slots, demand or {})
    plan: dict[str, list[int]] = {name: [] for name in sorted(wanted)}
    busiest_first = bound.busiest_first(list(plan))
    _keep_held(plan, busiest_first, wanted, held, room, bound, cache, only)
    short = []
    caps = bound.caps(eps)
    for name in busiest_first:
        where, count = plan[name], wanted[name]
        if len(where) == count:
            continue
        _fill(name, where, count, room, cache, bound, caps, only.get(name))
        if len(where) < count:  # past the demand bound only when no instance allows it
            _fill(name, where, count, room, cache, bound, None, only.get(name))
        if len(where) < count:
            short.append(name)
    if short:
        _repair(plan, short, wanted, room, cache, only)
    return plan


def _room(
    wanted: Mapping[str, int],
    slots: Mapping[int, int],
    held: Mapping[int, Collection[str]],
    eps: float,
) -> dict[int, int]:
    """Copies each instance may still take: its free slots, capped by the load bound."""
    total, all_slots = sum(wanted.values()), sum(slots.values()) or 1
    room = {}
    for iid, n_slots in slots.items():
        taken = sum(1 for name in held.get(iid, ()) if name not in wanted)
        bound = math.ceil((1 + eps) * total * n_slots / all_slots)
        room[iid] = max(0, min(n_slots - taken, bound))
    return room


class _DemandBound:
    """Each instance's share of the placed adapters' demand (``load``), against its fair share.

    A copy carries its adapter's demand divided by its copies (``per_copy``: the router
    spreads an adapter's requests over its copies). A copy fits an instance while the
    instance stays within its cap, ``(1 + eps)`` times its fair share by slots, or has no
    demand yet (a copy busier than any share goes somewhere). With no demand known every
    copy fits, and adapters keep their order by name. The checks are written out where
    they run (``_keep_held``, ``_fill``): every held copy is checked on every pass.
    """

    def __init__(
        self, wanted: Mapping[str, int], slots: Mapping[int, int], demand: Mapping[str, float]
    ) -> None:
        total, all_slots = sum(demand.get(name, 0.0) for name in wanted), sum(slots.values()) or 1
        self._fair = {iid: total * n_slots / all_slots for iid, n_slots in slots.items()}
        self._active = total > 0
        self.per_copy = {name: demand.get(name, 0.0) / n for name, n in wanted.items()}
        self.load = dict.fromkeys(slots, 0.0)

    def caps(self, eps: float) -> dict[int, float]:
        """Each instance's cap at ``eps``: the demand a copy may take it to."""
        return {iid: (1 + eps) * fair for iid, fair in self._fair.items()}

    def busiest_first(self, names_in_order: list[str]) -> list[str]:
        """Names by demand per copy, busiest first; equals keep their order (the sort is
        stable), so names given sorted come out the same for everyone."""
        if not self._active:
            return names_in_order
        return sorted(names_in_order, key=self.per_copy.__getitem__, reverse=True)


def _keep_held(
    plan: dict[str, list[int]],
    busiest_first: list[str],
    wanted: Mapping[str, int],
    held: Mapping[int, Collection[str]],
    room: dict[int, int],
    bound: _DemandBound,
    cache: RendezvousCache,
    only: Mapping[str, set[int]],
) -> None:
    """Stickiness: copies already held count as placed, best-ranked holders first, while
    their instance's demand stays within ``HELD_DEMAND_EPS`` (busiest adapters kept first)
    and the instance can take the adapter (``only``)."""
    holders: dict[str, list[int]] = defaultdict(list)
    for iid, names in held.items():
        if iid in room:
            for name in names:
                if name in wanted and (name not in only or iid in only[name]):
                    holders[name].append(iid)
    load, cap = bound.load, bound.caps(HELD_DEMAND_EPS)
    for name in busiest_first:  # whatever order ``held`` came in
        candidates = holders.get(name)
        if not candidates:
            continue
        share, keeps = bound.per_copy[name], []
        for iid in candidates:  # a loop, not a comprehension: no frame per adapter
            if room[iid] > 0 and (load[iid] == 0 or load[iid] + share <= cap[iid]):
                keeps.append(iid)
        if len(keeps) > wanted[name]:  # not all stay: the best-ranked do
            keeps = [iid for iid in cache.order(name) if iid in keeps][: wanted[name]]
        plan[name] = keeps
        for iid in keeps:
            room[iid] -= 1
            load[iid] += share


def _fill(
    name: str,
    where: list[int],
    count: int,
    room: dict[int, int],
    cache: RendezvousCache,
    bound: _DemandBound,
    cap: Mapping[int, float] | None,
    only: set[int] | None,
) -> None:
    """Walk ``name``'s rendezvous order, skipping instances full or at their bound, those
    that cannot take it (not in ``only``, when given) and (``cap`` given) those a copy
    would take past their demand cap."""
    load, share = bound.load, bound.per_copy[name]
    for rank in cache._ranked_entries(name):
        iid = _ranked_id(rank)
        if room[iid] > 0 and iid not in where and (only is None or iid in only):
            if cap is not None and load[iid] != 0 and load[iid] + share > cap[iid]:
                continue
            where.append(iid)
            room[iid] -= 1
            load[iid] += share
            if len(where) == count:
                return


def _repair(
    plan: dict[str, list[int]],
    short: list[str],
    wanted: Mapping[str, int],
    room: dict[int, int],
    cache: RendezvousCache,
    only: Mapping[str, set[int]],
) -> None:
    """Give adapters short of copies a place by moving one copy out of a full instance.

    Every instance with room already holds a short adapter (or ``_fill`` would have used
    it), so a full instance ``j`` hands one of its copies to an instance with room that
    lacks it, and takes the short adapter: e.g. two full instances that both dropped the
    same adapter for a newcomer, which can hold it only once.
    """
    on: dict[int, list[str]] = defaultdict(list)
    for name, where in plan.items():
        for iid in where:
            on[iid].append(name)
    for name in short:
        where = plan[name]
        while len(where) < wanted[name] and _swap_in(name, where, plan, on, room, cache, only):
            pass


def _swap_in(
    name: str,
    where: list[int],
    plan: dict[str, list[int]],
    on: dict[int, list[str]],
    room: dict[int, int],
    cache: RendezvousCache,
    only: Mapping[str, set[int]],
) -> bool:
    """Move one copy from a full instance to one with room, and put ``name`` in its place
    (each only where it can go: ``only``)."""
    spare = sorted(iid for iid, left in room.items() if left > 0)
    for iid in cache.order(name):
        if iid in where or room[iid] > 0 or (name in only and iid not in only[name]):
            continue
        for other in on[iid]:
            fits = only.get(other)
            target = next(
                (k for k in spare if k not in plan[other] and (fits is None or k in fits)), None
            )
            if target is None:
                continue
            plan[other].remove(iid)
            plan[other].append(target)
            on[iid].remove(other)
            on[target].append(other)
            room[target] -= 1
            where.append(iid)
            on[iid].append(name)
            return True
    return False
