"""Which adapter a load evicts when every slot is taken: the one the fleet asks least for.

Reads the controller's records only. The adapter the fleet asks least for goes first
(``FleetDemand``; least recently used breaks ties; one loaded within ``in_use_s`` that
has served nothing yet goes last, and one placement put here goes after the others),
never a pinned or busy one, one whose lock is held (a load or swap runs on it), nor the
last warm copy of one in use (fleet demand of at least ``IN_USE_RPS`` and a request
served here within the last ``in_use_s``). A load that finds no candidate while another
load holds a slot on its way in waits for that load's outcome (``load_under_way``), then
looks again, rather than answering 429.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Final, Protocol

from lorafleet.fleet.placement import IN_USE_RPS
from lorafleet.proto.errors import CapacityError
from lorafleet.worker.adapter_record import AdapterRecord, Role
from lorafleet.worker.demand import DemandMeter

__all__ = ["Eviction", "FleetDemand", "IN_USE_S"]

IN_USE_S: Final = 2.0
"""An adapter with demand that served a request (or loaded) this recently is "in use": its
last warm copy is never evicted (``--lora-in-use-s``)."""


class FleetDemand(Protocol):
    """What eviction needs to know about the fleet (the worker's placement answers it)."""

    def demand_rps(self, name: str) -> float:
        """Requests per second for ``name`` across the fleet, recently."""
        ...

    def copies(self, name: str) -> int:
        """Live instances holding ``name`` now (this one included)."""
        ...


class Eviction:
    """Chooses the adapter to evict among the controller's records.

    Example::

        eviction = Eviction(controller.records, demand, fleet=placement, in_use_s=2.0)
        victim = eviction.candidate()          # None when nothing may go
    """

    def __init__(
        self, records: Mapping[str, AdapterRecord], demand: DemandMeter, *,
        fleet: FleetDemand | None = None, in_use_s: float = IN_USE_S,
    ) -> None:  # fmt: skip
        self._records = records
        self._demand = demand
        self.fleet = fleet
        self.in_use_s = in_use_s

    def candidate(self) -> str | None:
        """The name of the adapter to evict next, None when every one must stay."""
        record = self._candidate()
        return record.name if record is not None else None

    def victim_for(self, name: str, max_loras: int, evict_placed: bool) -> AdapterRecord:
        """The record to evict so ``name`` gets a slot; ``CapacityError`` (429) if none may go."""
        victim = self._candidate()
        taken = f"all {max_loras} adapter slots are taken by " + str(
            sorted(n for n, record in self._records.items() if record.slots)
        )
        if victim is None:
            raise CapacityError(
                f"cannot load adapter {name!r}: every adapter slot is pinned or busy (or the "
                f"last warm copy of an adapter in use); {taken}; unload one first",
                lora_name=name,
            )
        if victim.role is Role.PLACED and not evict_placed:
            raise CapacityError(
                f"cannot load adapter {name!r} without evicting {victim.name!r}, which placement "
                f"chose this instance for, and the load asked to keep placed copies "
                f"(evict_placed: false); {taken}",
                lora_name=name,
            )
        return victim

    def load_under_way(self, name: str) -> AdapterRecord | None:
        """Another adapter's load that holds a slot and will end soon (``arriving``, its lock
        held): a load of ``name`` that finds no slot waits for it rather than refusing."""
        return next(
            (
                record
                for record in self._records.values()
                if record.name != name and record.arriving and record.lock.locked()
            ),
            None,
        )

    def fleet_demand(self, name: str) -> float:
        """Requests per second for ``name``: the fleet's, else this worker's own."""
        return self._demand.rate(name) if self.fleet is None else self.fleet.demand_rps(name)

    def _candidate(self) -> AdapterRecord | None:
        now = time.monotonic()
        free = [
            record
            for record in self._records.values()
            if record.serving is not None
            and not record.pinned
            and not record.busy
            and not record.lock.locked()
            and not self._last_warm_copy_in_use(record, now)
        ]
        return min(
            free,
            key=lambda record: (
                self._just_loaded(record, now), record.role is Role.PLACED,
                self.fleet_demand(record.name), record.last_used,
            ),
            default=None,
        )  # fmt: skip

    def _just_loaded(self, record: AdapterRecord, now: float) -> bool:
        """Loaded less than ``in_use_s`` ago and no request served since: the requests that
        waited for the load are on their way, so it goes last. A cold adapter has no demand
        yet, and by demand alone it went first (``bench.placement``: evicted 1 ms after its
        load, its requests waited out the frontend's 60 s on-demand timeout)."""
        return record.unserved and record.idle_s(now) < self.in_use_s

    def _last_warm_copy_in_use(self, record: AdapterRecord, now: float) -> bool:
        """No card on another instance, fleet demand of at least ``IN_USE_RPS``, and a
        request served within ``in_use_s`` (or the load then: its waiting requests are on
        their way). Demand alone is not enough: at 25 req/s over Zipf-distributed adapters
        more adapters pass ``IN_USE_RPS`` than there are slots, and cold loads then found
        no slot at all (``bench.placement``)."""
        copies = 1 if self.fleet is None else self.fleet.copies(record.name)
        return (
            copies <= 1
            and record.idle_s(now) < self.in_use_s
            and self.fleet_demand(record.name) >= IN_USE_RPS
        )
