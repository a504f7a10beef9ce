"""Keep this worker's ``InstanceLoad`` in etcd under its lease: slots, load, demand, cache hits.

Placement on every worker and the frontends read these records. A change
(a load, an unload, a request starting or ending, a failure) is written within
``MIN_INTERVAL_S`` and changes in between are coalesced into one write; while any
adapter has demand the record is refreshed every ``DEMAND_REFRESH_S`` so readers
see it decay. Must not decide anything: it only reports.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Final, TypeAlias

import structlog

from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.errors import LorafleetError
from lorafleet.proto.fleet_load import InstanceLoad, LoadFailure, encode_instance_load
from lorafleet.worker import metrics
from lorafleet.worker.lora_controller import LoraController

__all__ = ["FailureSource", "LoadReport"]

log = structlog.get_logger(__name__)

MIN_INTERVAL_S: Final = 0.5
"""At most one write per this long; changes in between are coalesced."""
DEMAND_REFRESH_S: Final = 2.0
"""Rewrite at least this often while demand is not zero, so its decay shows."""

FailureSource: TypeAlias = Callable[[], Mapping[str, LoadFailure]]
"""Returns the adapters this worker failed to load now (placement's retry state)."""


class LoadReport:
    """Writes one worker's load record whenever it changes, coalesced, until closed.

    Example::

        report = LoadReport.start(lease, key, controller=controller, failures=lambda: {})
        report.mark_changed()
        await report.aclose()  # deletes the record
    """

    def __init__(
        self,
        lease: LeaseKeeper,
        key: str,
        *,
        controller: LoraController,
        failures: FailureSource,
    ) -> None:
        self._lease = lease
        self._key = key
        self._controller = controller
        self._failures = failures
        self._written: InstanceLoad | None = None
        self._changed = asyncio.Event()
        self._writing = asyncio.Lock()
        self._closed = False
        """One write at a time: the loop's, or an eviction's ``write_now``."""
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def start(
        cls,
        lease: LeaseKeeper,
        key: str,
        *,
        controller: LoraController,
        failures: FailureSource,
    ) -> LoadReport:
        """Write the record now and follow the controller's changes from now on."""
        report = cls(lease, key, controller=controller, failures=failures)
        controller.on_change = report.mark_changed
        controller.on_evict = report.write_now
        report.mark_changed()
        report._task = asyncio.create_task(report._report_loop(), name="load-report")
        return report

    def mark_changed(self) -> None:
        """Something in the record changed: write it within ``MIN_INTERVAL_S``."""
        self._changed.set()

    def record(self) -> InstanceLoad:
        """The record as it stands now."""
        controller = self._controller
        evicts = controller.eviction_candidate() or ""
        queries, hits = metrics.prefix_cache_totals()
        return InstanceLoad(
            base_model=controller.base_model,
            max_loras=controller.max_loras,
            loaded=sorted(controller.loaded),
            loading=sorted(controller.loading),
            in_flight=controller.in_flight,
            demand=controller.demand.rates(),
            failed=dict(sorted(self._failures().items())),
            evicts=evicts,
            evicted=controller.evicted(),
            evicts_placed=controller.is_placed(evicts),
            prefix_cache_queries=queries,
            prefix_cache_hits=hits,
        )

    async def write_now(self) -> None:
        """Write the record now, not coalesced: an eviction waits for it before the card goes,
        so frontends see ``evicted`` no later than the card's deletion."""
        if not self._closed:
            await self._write_if_changed()

    async def aclose(self) -> None:
        """Stop writing and delete the record (a crash leaves it to the lease)."""
        self._controller.on_change = lambda: None
        self._closed = True
        if self._task is not None:
            await cancel_and_wait(self._task)
        with contextlib.suppress(LorafleetError):
            await self._lease.delete(self._key)

    async def _report_loop(self) -> None:
        while True:
            refresh_s = DEMAND_REFRESH_S if self._written and self._written.demand else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), refresh_s)
            self._changed.clear()
            await self._write_if_changed()
            await asyncio.sleep(MIN_INTERVAL_S)

    async def _write_if_changed(self) -> None:
        async with self._writing:
            record = self.record()
            if record == self._written:
                return
            try:
                await self._lease.put(self._key, encode_instance_load(record))
            except LorafleetError as exc:
                log.warning("load record not written; retrying", key=self._key, error=exc.message)
                self._changed.set()
                return
            self._written = record
