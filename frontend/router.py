"""Choose which instance serves a request: round robin or fewest requests in flight.

Adapters always go to the instance with the fewest in flight among those that
have them loaded (affinity); ``--router`` chooses for base models.

Pure bookkeeping, no I/O: the dispatcher tells the router when an attempt on an
instance starts and finishes, and asks it for the next instance, excluding
those that already failed for this request. NATS never load-balances for us.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Container, Mapping, Sequence
from types import MappingProxyType
from typing import Final

from proto.discovery import Instance

__all__ = [
    "LeastInflightRouter",
    "ROUTERS",
    "RoundRobinRouter",
    "Router",
    "make_router",
]


class Router(abc.ABC):
    """Picks an instance among those serving a model and counts requests in flight."""

    def __init__(self) -> None:
        self._inflight: dict[int, int] = {}
        self._turns: dict[str, int] = {}

    @abc.abstractmethod
    def pick(
        self, model: str, instances: Sequence[Instance], exclude: Container[int] = ()
    ) -> Instance | None:
        """Return the instance for the next request to ``model``, or None if all are excluded."""

    def inflight(self, instance_id: int) -> int:
        """How many attempts on ``instance_id`` are running now."""
        return self._inflight.get(instance_id, 0)

    def started(self, instance_id: int) -> None:
        """An attempt on ``instance_id`` began."""
        self._inflight[instance_id] = self._inflight.get(instance_id, 0) + 1

    def finished(self, instance_id: int) -> None:
        """An attempt on ``instance_id`` ended (answered, failed or cancelled)."""
        left = self._inflight.get(instance_id, 0) - 1
        if left > 0:
            self._inflight[instance_id] = left
        else:
            self._inflight.pop(instance_id, None)

    def pick_least_inflight(
        self, model: str, instances: Sequence[Instance], exclude: Container[int] = ()
    ) -> Instance | None:
        """The instance with the fewest attempts in flight; ties rotate round robin.

        Adapters are always routed this way (affinity: ``instances`` are those that
        have the adapter loaded); base models follow the configured ``pick``.
        """
        count = len(instances)
        if count == 0:
            return None
        start = self._next_turn(model)
        best: Instance | None = None
        best_load = 0
        for offset in range(count):
            instance = instances[(start + offset) % count]
            if instance.instance_id in exclude:
                continue
            load = self._inflight.get(instance.instance_id, 0)
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
