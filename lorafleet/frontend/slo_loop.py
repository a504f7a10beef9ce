"""Publish this frontend's latency windows, judge each window, and show the fleet's attainment.

When a window ends, every frontend puts its counts (``frontend.slo_meter``) under its own
lease (``v1/slo/{ns}/reports/{frontend}``). A grace later each frontend sums every report
of that window (``fleet.slo.merge_reports``), sets the attainment gauges, and judges each
adapter with targets (``fleet.slo.next_slo_copies``); a step is written with a
compare-and-swap on ``v1/slo/{ns}/copies/{slug}`` (no lease), so of the frontends judging
the same window one wins and the others see its record. Workers read that record as a
lower bound on the adapter's copies (``worker.placement``); ``/v1/adapters`` shows it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

import structlog

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import (
    slo_copies_key,
    slo_copies_prefix,
    slo_report_key,
    slo_reports_prefix,
)
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.fleet.slo import attainment_of, merge_reports, next_slo_copies
from lorafleet.frontend.desired_state import DesiredState
from lorafleet.frontend.metrics import FrontendMetrics
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.frontend.slo_meter import SloMeter
from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.adapters import MAX_REPLICAS, AdapterSpec, replica_bounds
from lorafleet.proto.errors import LorafleetError
from lorafleet.proto.naming import lora_slug
from lorafleet.proto.slo import (
    SloAttainment,
    SloCopies,
    SloCounts,
    SloReport,
    decode_slo_copies,
    decode_slo_report,
    encode_slo_copies,
    encode_slo_report,
)

__all__ = ["SloLoop"]

log = structlog.get_logger(__name__)

TICK_S: Final = 0.2
"""How often a frontend looks for an ended window to publish or judge."""
GRACE_S: Final = 0.5
"""How long after a window ends it is judged: every frontend has published it by then."""


class SloLoop:
    """This frontend's window reports, its judging of windows, and the fleet's last window."""

    def __init__(
        self, etcd: EtcdClient, meter: SloMeter, lease: LeaseKeeper, *,
        registry: ModelRegistry, desired: DesiredState, metrics: FrontendMetrics,
        reports: WatchCache[SloReport], copies: WatchCache[SloCopies], min_requests: int,
    ) -> None:  # fmt: skip
        self._etcd = etcd
        self.meter = meter
        self._lease = lease
        self._registry = registry
        self._desired = desired
        self._metrics = metrics
        self._reports = reports
        self._copies = copies
        self._min_requests = min_requests
        self._published = meter.window_now() - 1
        self._judged = self._published
        self._last: dict[str, SloCounts] = {}
        """The fleet's counts of the last judged window, by adapter."""
        self._gauged: set[str] = set()
        """Adapters that may have an attainment series."""
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, etcd: EtcdClient, meter: SloMeter, lease: LeaseKeeper, *, registry: ModelRegistry,
        desired: DesiredState, metrics: FrontendMetrics, min_requests: int,
    ) -> SloLoop:  # fmt: skip
        """Follow the reports and the copies records, and judge from now on."""
        namespace = desired.namespace
        reports = await WatchCache.start(etcd, slo_reports_prefix(namespace), decode_slo_report)
        try:
            copies = await WatchCache.start(etcd, slo_copies_prefix(namespace), decode_slo_copies)
        except Exception:
            await reports.aclose()
            raise
        loop = cls(etcd, meter, lease, registry=registry, desired=desired, metrics=metrics,
                   reports=reports, copies=copies, min_requests=min_requests)  # fmt: skip
        loop._task = asyncio.create_task(loop._judge_loop(), name="slo-judge")
        return loop

    async def aclose(self) -> None:
        """Stop judging and following (the reports go when the frontend's lease is revoked)."""
        if self._task is not None:
            await cancel_and_wait(self._task)
        await asyncio.gather(self._reports.aclose(), self._copies.aclose())

    def attainment(self, spec: AdapterSpec) -> SloAttainment | None:
        """``spec``'s attainment in the fleet's last judged window; None without targets."""
        if spec.slo is None:
            return None
        return attainment_of(
            self._last.get(spec.name), window_s=self.meter.window_s, copies=self._stored(spec.name)
        )

    async def _judge_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self._tick()
            except LorafleetError as exc:  # etcd away: the next window tries again
                log.warning("slo window step failed", error=exc.message)
            except Exception:  # a bug must not stop the judging for good
                log.exception("slo window step failed unexpectedly")

    async def _tick(self) -> None:
        """Publish the window that just ended; judge it a grace later."""
        ended = self.meter.window_now() - 1
        if ended > self._published:
            self._published = ended
            counts = self.meter.take_before(ended + 1).get(ended, {})
            if self.meter.targets() or counts:
                await self._publish(ended, counts)
        judge_at = (ended + 1) * self.meter.window_s + GRACE_S
        if ended > self._judged and time.time() >= judge_at:
            self._judged = ended
            await self._judge(ended)

    async def _publish(self, window: int, counts: dict[str, SloCounts]) -> None:
        report = SloReport(window_s=self.meter.window_s, window=window, adapters=counts)
        key = slo_report_key(self._desired.namespace, f"{self._lease.lease_id:x}")
        await self._lease.put(key, encode_slo_report(report))

    async def _judge(self, window: int) -> None:
        """Sum every frontend's report of ``window``; add a copy where a target is missed."""
        self._last = merge_reports(self._reports.items.values(), window_s=self.meter.window_s,
                                   window=window)  # fmt: skip
        targets = self.meter.targets()
        for name, wanted in targets.items():
            spec, counts = self._desired.get(name), self._last.get(name)
            if spec is None:
                continue
            if counts is not None and counts.requests:
                self._metrics.slo_attainment(name, counts.met / counts.requests)
            current = self._stored(name)
            step = next_slo_copies(
                name, counts, wanted, current=current, live=self._live(name),
                most=_most(spec), window=window, min_requests=self._min_requests,
            )  # fmt: skip
            if step is not None:
                await self._swap(name, current, step)
        for gone in self._gauged - targets.keys():
            self._metrics.slo_forget(gone)
        self._gauged = set(targets)
        for stale in [c for c in self._copies.items.values() if c.name not in targets]:
            await self._swap(stale.name, stale, None)  # targets removed, or adapter deleted

    def _stored(self, name: str) -> SloCopies | None:
        stored = self._copies.items.get(slo_copies_key(self._desired.namespace, lora_slug(name)))
        return stored if stored is not None and stored.name == name else None

    def _live(self, name: str) -> int:
        """Live instances with ``name``'s card."""
        served = self._registry.get(name)
        return len(served.instances) if served is not None and served.parent is not None else 0

    async def _swap(self, name: str, expected: SloCopies | None, new: SloCopies | None) -> None:
        """Store ``new`` (None: delete) if etcd still holds ``expected``; else leave it: another
        frontend judged first, and this one's cache shows its record soon."""
        key = slo_copies_key(self._desired.namespace, lora_slug(name))
        with self._etcd.errors("get", key):
            found = await self._etcd.get(key.encode())
        revision = 0 if found is None else found.mod_revision
        if (None if found is None else _decoded(found.value)) != expected:
            return
        txn = self._etcd.transactions
        write = txn.delete(key.encode()) if new is None else txn.put(
            key.encode(), encode_slo_copies(new)
        )  # fmt: skip
        with self._etcd.errors("transaction", key):
            swapped, _ = await self._etcd.transaction(
                compare=[txn.mod(key.encode()) == revision], success=[write], failure=[]
            )
        if swapped and new is not None:
            log.info("adapter copy added for its latency target", adapter=name,
                     copies=new.copies, reason=new.reason, window=new.window)  # fmt: skip


def _most(spec: AdapterSpec) -> int:
    """The most copies ``spec`` may have (``"all"``: as many as there are instances)."""
    high = replica_bounds(spec)[1]
    return MAX_REPLICAS if high == "all" else high


def _decoded(raw: bytes) -> SloCopies | None:
    try:
        return decode_slo_copies(raw)
    except ValueError:  # a broken record is replaced
        return None
