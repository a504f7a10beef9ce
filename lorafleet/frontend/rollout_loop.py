"""Measure each alias version's requests here, publish each window's counts, judge windows.

Every frontend counts the requests of aliases with a running rollout by window
(``Rollout.window_started_at`` + k x ``window_s``). When window k ends it puts its
counts under its own lease (``v1/rollouts/{ns}/{slug}/{frontend}``); a grace later any
frontend reads every report of k, judges it (``frontend.rollout.judge``) and writes the
verdict with a compare-and-swap on the alias record, so exactly one verdict per window
wins. A frontend that stops takes its reports with its lease.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import time
from typing import Final

import msgspec
import structlog

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import rollout_report_key, rollout_reports_prefix
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.frontend.aliases import AliasBook
from lorafleet.frontend.metrics import FrontendMetrics
from lorafleet.frontend.rollout import judge
from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.aliases import TTFT_BOUNDS_MS, Alias, Rollout, VersionCounts, WindowReport
from lorafleet.proto.errors import LorafleetError
from lorafleet.proto.naming import lora_slug

__all__ = ["AliasCall", "RolloutLoop"]

log = structlog.get_logger(__name__)

TICK_S: Final = 0.2
"""How often a frontend publishes ended windows and looks for windows to judge."""
GRACE_S: Final = 0.5
"""How long after a window ends it is judged: every frontend has published it by then."""
CLIENT_GONE_STATUS: Final = 499
VERSION_FAULTS: Final = frozenset({404, 424})
"""Statuses below 500 that are the version's fault, not the client's: the client named the
alias, and the version it was sent to is gone (404) or cannot be loaded (424)."""

_WindowKey = tuple[str, float, int]
"""An alias, its step's ``window_started_at``, and a window index."""
_report_decoder: Final = msgspec.json.Decoder(WindowReport)


class AliasCall:
    """One request sent to an alias's version: its TTFT and outcome, counted once at its end."""

    def __init__(self, loop: RolloutLoop, alias: str, version: str) -> None:
        self._loop = loop
        self.alias = alias
        self.version = version
        self._ttft_s: float | None = None
        self._ended = False

    def first_token(self, seconds: float) -> None:
        """The first token came ``seconds`` after the request."""
        if self._ttft_s is None:
            self._ttft_s = seconds

    def ended(self, status: int) -> None:
        """The request ended with ``status`` (the first call counts; 499, a client gone, not).

        A 5xx, 404 or 424 counts against the version; other 4xx are the client's fault.
        """
        if self._ended:
            return
        self._ended = True
        if status != CLIENT_GONE_STATUS:
            failed = status >= 500 or status in VERSION_FAULTS
            self._loop.count(self.alias, self.version, failed=failed, ttft_s=self._ttft_s)


class RolloutLoop:
    """This frontend's window counts, their reports in etcd, and the judging of windows."""

    def __init__(
        self, etcd: EtcdClient, book: AliasBook, lease: LeaseKeeper, metrics: FrontendMetrics
    ) -> None:
        self._etcd = etcd
        self.book = book
        self._lease = lease
        self._metrics = metrics
        self.frontend_id = os.urandom(6).hex()
        self._tally: dict[_WindowKey, dict[str, VersionCounts]] = {}
        self._published: set[_WindowKey] = set()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, etcd: EtcdClient, book: AliasBook, lease: LeaseKeeper, metrics: FrontendMetrics
    ) -> RolloutLoop:
        """Start judging; reports go under ``lease``, this frontend's (its owner revokes it)."""
        loop = cls(etcd, book, lease, metrics)
        loop._task = asyncio.create_task(loop._judge_loop(), name="rollout-judge")
        return loop

    async def aclose(self) -> None:
        """Stop judging (the reports go when the frontend's lease is revoked)."""
        if self._task is not None:
            await cancel_and_wait(self._task)

    def pick(self, name: str, session: str) -> AliasCall | None:
        """The version a request for ``name`` goes to, tracked; None when ``name`` is no alias.

        ``session`` (``x-session-id``, else OpenAI's ``user``) keeps a conversation on one
        version; without one the split is random.
        """
        version = self.book.pick(name, session)
        return None if version is None else AliasCall(self, name, version)

    def count(self, alias: str, version: str, *, failed: bool, ttft_s: float | None) -> None:
        """Count one ended request in the metrics and, while a rollout runs, in its window."""
        self._metrics.alias_request(alias, version, failed=failed, ttft_s=ttft_s)
        record = self.book.get(alias)
        rollout = None if record is None else record.rollout
        if rollout is None or rollout.phase != "running":
            return
        window = int((time.time() - rollout.window_started_at) // rollout.policy.window_s)
        key = (alias, rollout.window_started_at, window)
        counts = self._tally.setdefault(key, {}).setdefault(version, VersionCounts())
        counts.requests += 1
        counts.errors += failed
        if ttft_s is not None:
            counts.ttft_buckets[bisect.bisect_left(TTFT_BOUNDS_MS, ttft_s * 1000)] += 1

    async def _judge_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            running = [a for a in self.book.records() if a.rollout and a.rollout.phase == "running"]
            self._forget_ended(running)
            for alias in running:
                assert alias.rollout is not None
                try:
                    await self._step(alias, alias.rollout, time.time())
                except LorafleetError as exc:  # etcd away: the next tick tries again
                    log.warning("rollout step failed", alias=alias.name, error=exc.message)
                except Exception:  # a bug must not stop every rollout of this frontend
                    log.exception("rollout step failed unexpectedly", alias=alias.name)

    def _forget_ended(self, running: list[Alias]) -> None:
        """Drop the counts of steps no longer running (moved on, promoted, rolled back)."""
        live = {(a.name, a.rollout.window_started_at) for a in running if a.rollout}
        for key in [key for key in self._tally if key[:2] not in live]:
            del self._tally[key]

    async def _step(self, alias: Alias, rollout: Rollout, now: float) -> None:
        """Publish the window to judge once it ended; judge it a grace later."""
        ends = rollout.window_started_at + (rollout.next_window + 1) * rollout.policy.window_s
        key = (alias.name, rollout.window_started_at, rollout.next_window)
        if now >= ends and key not in self._published:
            await self._publish(key)
        if now >= ends + GRACE_S:
            await self._judge(alias.name, rollout)

    async def _publish(self, key: _WindowKey) -> None:
        name, started_at, window = key
        versions = self._tally.get(key, {})
        report = WindowReport(alias=name, window_started_at=started_at, window=window,
                              versions=versions)  # fmt: skip
        slug = lora_slug(name)
        await self._lease.put(rollout_report_key(self.book.namespace, slug, self.frontend_id),
                              msgspec.json.encode(report))  # fmt: skip
        self._published = {k for k in self._published if k[0] != name or k[1:] > key[1:]}
        self._published.add(key)
        for old in [k for k in self._tally if k[0] == name and k[1:] <= key[1:]]:
            del self._tally[old]

    async def _judge(self, name: str, rollout: Rollout) -> None:
        prefix = rollout_reports_prefix(self.book.namespace, lora_slug(name))
        with self._etcd.errors("get prefix", prefix):
            listing = await self._etcd.get_prefix(prefix.encode())
        reports = [_decoded(kv.value) for kv in listing]
        now = time.time()

        def verdict(current: Alias | None) -> Alias | None:
            if current is None or current.rollout != rollout:  # judged already, or changed
                return current
            return judge(current, [r for r in reports if r is not None], now)

        stored = await self.book.update(name, verdict)
        if stored is not None and stored.rollout is not None and stored.rollout != rollout:
            log.info("rollout window judged", alias=name, phase=stored.rollout.phase,
                     weight=stored.rollout.weight, reason=stored.rollout.reason)  # fmt: skip


def _decoded(raw: bytes) -> WindowReport | None:
    try:
        return _report_decoder.decode(raw)
    except msgspec.ValidationError:
        return None
