"""Judge adapters' latency targets from the frontends' window counts: pure, no I/O.

A frontend merges every frontend's report of one window (``merge_reports``), reads the
fleet's attainment and p95s from the sums (``attainment_of``), and decides whether an
adapter that misses a target gets one more copy (``next_slo_copies``). Placement then
keeps at least that many copies while the adapter has demand (``slo_floor``). A step
waits for the copy of the previous one to be live, and for a window measured after it,
so one slow window adds one copy, not one per judging pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from lorafleet.proto.slo import (
    SLO_BOUNDS_MS,
    SloAttainment,
    SloCopies,
    SloCounts,
    SloReport,
    SloTargets,
)

__all__ = [
    "P95_SHARE",
    "SETTLE_WINDOWS",
    "attainment_of",
    "merge_reports",
    "miss_reason",
    "next_slo_copies",
    "p95_ms",
    "slo_floor",
]

P95_SHARE: Final = 0.95
"""A p95 target is met while at least this share of requests is within it."""
SETTLE_WINDOWS: Final = 2
"""Windows between two steps: the window after a step may have been measured before its
copy served anything."""
ATTAINMENT_DIGITS: Final = 4


def merge_reports(
    reports: Iterable[SloReport], *, window_s: float, window: int
) -> dict[str, SloCounts]:
    """Every frontend's counts of ``window`` (of ``window_s`` seconds), summed by adapter."""
    merged: dict[str, SloCounts] = {}
    for report in reports:
        if report.window != window or report.window_s != window_s:
            continue
        for name, counts in report.adapters.items():
            merged.setdefault(name, SloCounts()).add(counts)
    return merged


def p95_ms(buckets: Mapping[int, int]) -> float | None:
    """The upper bound of the bucket holding the 95th percentile; None without requests."""
    total = sum(buckets.values())
    if total == 0:
        return None
    seen = 0
    for bucket in sorted(buckets):
        seen += buckets[bucket]
        if seen >= P95_SHARE * total:
            return SLO_BOUNDS_MS[min(bucket, len(SLO_BOUNDS_MS) - 1)]
    return SLO_BOUNDS_MS[-1]


def attainment_of(
    counts: SloCounts | None, *, window_s: float, copies: SloCopies | None = None
) -> SloAttainment:
    """What ``/v1/adapters`` shows: the window's figures, and the copies the targets added."""
    added, reason = (0, "") if copies is None else (copies.copies, copies.reason)
    if counts is None or counts.requests == 0:
        return SloAttainment(window_s=window_s, copies=added, reason=reason)
    return SloAttainment(
        window_s=window_s, requests=counts.requests,
        attainment=round(counts.met / counts.requests, ATTAINMENT_DIGITS),
        ttft_p95_ms=_shown(p95_ms(counts.ttft_buckets)),
        itl_p95_ms=_shown(p95_ms(counts.itl_buckets)),
        copies=added, reason=reason,
    )  # fmt: skip


def _shown(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 1)


def miss_reason(counts: SloCounts, targets: SloTargets) -> str:
    """Which target the counts miss (fewer than 95% within it), in words; ``""`` if none."""
    checks = (
        ("ttft", targets.ttft_p95_ms, counts.ttft_met, counts.requests, counts.ttft_buckets),
        ("itl", targets.itl_p95_ms, counts.itl_met, counts.itl_requests, counts.itl_buckets),
    )
    for label, target, met, measured, buckets in checks:
        if target is not None and measured and met < P95_SHARE * measured:
            observed = p95_ms(buckets)
            shown = "?" if observed is None else f"{observed:.0f}"
            return f"{label} p95 {shown} ms > target {target:g} ms"
    return ""


def next_slo_copies(
    name: str, counts: SloCounts | None, targets: SloTargets, *,
    current: SloCopies | None, live: int, most: int, window: int, min_requests: int,
) -> SloCopies | None:  # fmt: skip
    """The record to store after judging ``window``, or None to leave ``current`` as is.

    A copy is added (one more than the ``live`` ones, at most ``most``) when the window
    had at least ``min_requests`` answered requests (demand) and missed a target, the
    copy of the previous step is live, and ``SETTLE_WINDOWS`` passed since that step.
    """
    if counts is None or counts.requests < min_requests:
        return None
    reason = miss_reason(counts, targets)
    if not reason or live + 1 > most:
        return None
    if current is not None and (window < current.window + SETTLE_WINDOWS or live < current.copies):
        return None
    return SloCopies(name=name, copies=live + 1, reason=reason, window=window)


def slo_floor(copies: SloCopies | None, *, demand_rps: float, in_use_rps: float) -> int:
    """The fewest copies placement keeps for an adapter's targets: the record's, while the
    adapter has at least ``in_use_rps`` of demand; 0 once its traffic is gone (demand's
    own cool-down then removes the copy)."""
    if copies is None or demand_rps < in_use_rps:
        return 0
    return copies.copies
