"""Choose which instance serves a request: round robin or fewest requests in flight.

(The prefix-aware modes, ``prefix`` and ``prefix-approx``, build on this class:
``frontend.kv.prefix_router``.)

Adapters always go to the instance with the fewest in flight among those that
have them loaded (affinity), and among those to the one this frontend sent the
fewest requests lately: in flight is mostly 0 or 1 at a time, so without that the
copies of a popular adapter took turns whatever else their instances served, and
the instance that also held other busy adapters served 1.5 times the fleet's mean
(``bench.placement``). ``--router`` chooses for base models.

Pure bookkeeping, no I/O: the dispatcher tells the router when an attempt on an
instance starts and finishes, and asks it for the next instance, excluding
those that already failed for this request. NATS never load-balances for us.
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Callable, Container, Mapping, Sequence
from types import MappingProxyType
from typing import Final

from lorafleet.frontend.registry import ServedModel
from lorafleet.proto.discovery import Instance
from lorafleet.proto.inference import GenerateRequest

__all__ = [
    "LeastInflightRouter",
    "ROUTERS",
    "RoundRobinRouter",
    "Router",
    "make_router",
]


SENT_HALF_LIFE_S: Final = 10.0
"""Half-life of the per-instance counts of requests sent (the tie-break among copies)."""
_RESCALE_EXPONENT: Final = math.log(1e12)
"""Counts grow as ``e^(rate * t)`` instead of decaying (one ``exp`` per request, no walk
over instances); past this exponent they are scaled back and the faded ones dropped."""


class Router(abc.ABC):
    """Picks an instance among those serving a model; counts requests in flight and sent."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._inflight: dict[int, int] = {}
        self._turns: dict[str, int] = {}
        self._clock = clock
        self._growth_per_s = math.log(2) / SENT_HALF_LIFE_S
        self._since = clock()
        self._sent: dict[int, float] = {}
        """Instance -> requests sent, each weighted ``e^(growth * (t - since))``: comparing
        them compares the decayed counts, which all share one factor."""

    @abc.abstractmethod
    def pick(
        self, model: str, instances: Sequence[Instance], exclude: Container[int] = ()
    ) -> Instance | None:
        """Return the instance for the next request to ``model``, or None if all are excluded."""

    def route(
        self, served: ServedModel, request: GenerateRequest, exclude: Container[int] = ()
    ) -> Instance | None:
        """The instance for ``request``: ``pick`` for a base model, the least busy copy for
        an adapter (the prefix router weighs the request's cached prefix for both)."""
        if served.parent is None:
            return self.pick(served.name, served.instances, exclude)
        return self.pick_least_inflight(served.name, served.instances, exclude)

    def load_of(self, request: GenerateRequest, instance_id: int) -> int:
        """The tokens ``request`` will keep ``instance_id`` busy with, as this router counts
        load (0: it counts requests, not tokens)."""
        return 0

    def inflight(self, instance_id: int) -> int:
        """How many attempts on ``instance_id`` are running now."""
        return self._inflight.get(instance_id, 0)

    def sent(self, instance_id: int) -> float:
        """Requests sent to ``instance_id`` lately, decayed: only comparisons between
        instances mean anything (all share one growing factor)."""
        return self._sent.get(instance_id, 0.0)

    def started(self, instance_id: int, tokens: int = 0) -> None:
        """An attempt on ``instance_id`` began (``tokens``: its ``load_of``)."""
        self._inflight[instance_id] = self._inflight.get(instance_id, 0) + 1
        exponent = self._growth_per_s * (self._clock() - self._since)
        if exponent > _RESCALE_EXPONENT:
            self._rescale(exponent)
            exponent = 0.0
        self._sent[instance_id] = self._sent.get(instance_id, 0.0) + math.exp(exponent)

    def _rescale(self, exponent: float) -> None:
        """Start the weights again at 1 now; instances not sent to for minutes drop out."""
        self._since = self._clock()
        fade = math.exp(-exponent)  # 0.0 after hours: everything has faded
        scaled = {iid: sent * fade for iid, sent in self._sent.items()}
        self._sent = {iid: sent for iid, sent in scaled.items() if sent > fade}

    def finished(self, instance_id: int, tokens: int = 0) -> None:
        """An attempt on ``instance_id`` ended (answered, failed or cancelled)."""
        left = self._inflight.get(instance_id, 0) - 1
        if left > 0:
            self._inflight[instance_id] = left
        else:
            self._inflight.pop(instance_id, None)

    def pick_least_inflight(
        self, model: str, instances: Sequence[Instance], exclude: Container[int] = ()
    ) -> Instance | None:
        """The instance with the fewest attempts in flight, then the fewest sent lately;
        ties rotate round robin.

        Adapters are always routed this way (affinity: ``instances`` are those that
        have the adapter loaded); base models follow the configured ``pick``.
        """
        count = len(instances)
        if count == 0:
            return None
        start = self._next_turn(model)
        best: Instance | None = None
        best_load = (0, 0.0)
        for offset in range(count):
            instance = instances[(start + offset) % count]
            if instance.instance_id in exclude:
                continue
            iid = instance.instance_id
            load = (self._inflight.get(iid, 0), self._sent.get(iid, 0.0))
            if best is None or load < best_load:
                best, best_load = instance, load
        return best

    def _next_turn(self, model: str) -> int:
        """A per-model counter that rotates the starting point of every pick."""
        turn = self._turns.get(model, 0)
        self._turns[model] = turn + 1
        return turn


class RoundRobinRouter(Router):
    """Each model's requests go to its instances in turn, skipping excluded ones."""

    def pick(
        self, model: str, instances: Sequence[Instance], exclude: Container[int] = ()
    ) -> Instance | None:
        count = len(instances)
        if count == 0:
            return None
        start = self._next_turn(model)
        for offset in range(count):
            instance = instances[(start + offset) % count]
            if instance.instance_id not in exclude:
                return instance
        return None


class LeastInflightRouter(Router):
    """The instance with the fewest attempts in flight wins; ties rotate round robin."""

    def pick(
        self, model: str, instances: Sequence[Instance], exclude: Container[int] = ()
    ) -> Instance | None:
        return self.pick_least_inflight(model, instances, exclude)


ROUTERS: Final[Mapping[str, Callable[[], Router]]] = MappingProxyType(
    {"round-robin": RoundRobinRouter, "least-inflight": LeastInflightRouter}
)
"""Router names accepted by ``--router``."""


def make_router(name: str) -> Router:
    """Build the router called ``name``; raises ValueError naming the choices."""
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown router {name!r}; choose one of {', '.join(ROUTERS)}") from None
