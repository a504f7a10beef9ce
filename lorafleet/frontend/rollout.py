"""A rollout's transitions: start, judge a window, promote, roll back (pure, no I/O).

Each returns the alias record to write; ``frontend.rollout_loop`` writes it with a
compare-and-swap on the record's revision, so one frontend's decision wins and the
others see it. A judged window sums every frontend's ``WindowReport``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

from lorafleet.proto.aliases import (
    TTFT_BOUNDS_MS,
    Alias,
    AliasTarget,
    Rollout,
    RolloutFigures,
    RolloutRequest,
    VersionCounts,
    VersionFigures,
    WindowReport,
)
from lorafleet.proto.errors import ConflictError

__all__ = [
    "DEFAULT_CANARY_WEIGHT",
    "figures_of",
    "judge",
    "merge_counts",
    "promote",
    "rollback",
    "start_rollout",
    "ttft_p95_ms",
]

DEFAULT_CANARY_WEIGHT: Final = 10
FULL: Final = 100
P95: Final = 0.95


def split(baseline: str, canary: str, weight: int) -> list[AliasTarget]:
    """The targets of a rollout at ``weight``: the canary last, so a session that reached it
    stays on it as its weight grows (``frontend.aliases.choose``)."""
    targets = [AliasTarget(model=baseline, weight=FULL - weight)]
    return [*targets, AliasTarget(model=canary, weight=weight)] if weight else targets


def start_rollout(current: Alias | None, request: RolloutRequest, now: float) -> Alias:
    """The alias with ``request``'s canary at its first weight and the policy running."""
    baseline = request.baseline or _heaviest(current)
    if baseline is None:
        raise ConflictError(
            f"alias {request.alias!r} does not exist; name its current version as baseline"
        )
    steps = request.policy.steps
    weight = request.weight or (steps[0] if steps else DEFAULT_CANARY_WEIGHT)
    rollout = Rollout(baseline=baseline, canary=request.canary, policy=request.policy,
                      weight=weight, window_started_at=now, reason="started")  # fmt: skip
    return Alias(name=request.alias, targets=split(baseline, request.canary, weight),
                 rollout=rollout)  # fmt: skip


def _heaviest(alias: Alias | None) -> str | None:
    if alias is None:
        return None
    if alias.rollout is not None and alias.rollout.phase == "running":
        return alias.rollout.baseline
    return max(alias.targets, key=lambda target: target.weight).model


def promote(alias: Alias, *, full: bool, now: float, reason: str = "promoted by hand") -> Alias:
    """The next step's weight (or 100 with ``full``, or without steps); 100 ends it."""
    rollout = _running(alias)
    higher = [step for step in rollout.policy.steps if step > rollout.weight]
    weight = FULL if full or not higher else higher[0]
    phase = "promoted" if weight == FULL else "running"
    moved = msgspec.structs.replace(rollout, weight=weight, phase=phase, reason=reason,
                                    window_started_at=now, next_window=0)  # fmt: skip
    targets = split(rollout.baseline, rollout.canary, weight)
    if weight == FULL:
        targets = [AliasTarget(model=rollout.canary, weight=FULL)]
    return msgspec.structs.replace(alias, targets=targets, rollout=moved)


def rollback(alias: Alias, reason: str, figures: RolloutFigures | None = None) -> Alias:
    """All weight back on the baseline; the rollout shows ``rolled_back``, why, and the figures."""
    rollout = _running(alias)
    back = msgspec.structs.replace(rollout, weight=0, phase="rolled_back", reason=reason,
                                   figures=figures or rollout.figures)  # fmt: skip
    targets = [AliasTarget(model=rollout.baseline, weight=FULL)]
    return msgspec.structs.replace(alias, targets=targets, rollout=back)


def _running(alias: Alias) -> Rollout:
    if alias.rollout is None or alias.rollout.phase != "running":
        state = "no rollout" if alias.rollout is None else f"a {alias.rollout.phase} rollout"
        raise ConflictError(f"alias {alias.name!r} has {state}; start one with a rollout")
    return alias.rollout


def judge(alias: Alias, reports: Iterable[WindowReport], now: float) -> Alias:
    """Judge the rollout's next window from every frontend's reports of it."""
    rollout = _running(alias)
    window = [r for r in reports if _reports_window(r, rollout)]
    counts = merge_counts(window)
    base = figures_of(counts.get(rollout.baseline))
    canary = figures_of(counts.get(rollout.canary))
    figures = RolloutFigures(window=rollout.windows + 1, frontends=len(window),
                             baseline=base, canary=canary)  # fmt: skip
    judged = msgspec.structs.replace(rollout, windows=rollout.windows + 1, figures=figures,
                                     next_window=rollout.next_window + 1)  # fmt: skip
    alias = msgspec.structs.replace(alias, rollout=judged)
    policy = rollout.policy
    if canary.requests < policy.min_requests:
        reason = f"waiting: {canary.requests} of {policy.min_requests} canary requests in a window"
        return msgspec.structs.replace(
            alias, rollout=msgspec.structs.replace(judged, reason=reason)
        )
    breach = _breach(rollout, base, canary)
    if breach:
        return rollback(alias, breach, figures)
    if policy.steps:
        return promote(alias, full=False, now=now, reason=f"healthy in window {figures.window}")
    return msgspec.structs.replace(alias, rollout=msgspec.structs.replace(judged, reason="healthy"))


def _reports_window(report: WindowReport, rollout: Rollout) -> bool:
    return (report.window_started_at, report.window) == (
        rollout.window_started_at, rollout.next_window,
    )  # fmt: skip


def _breach(rollout: Rollout, base: VersionFigures, canary: VersionFigures) -> str:
    """Why the canary breaks the policy, or ``""``."""
    policy = rollout.policy
    if canary.error_rate > policy.max_error_rate:
        return (f"error rate {canary.error_rate:.3f} of {rollout.canary!r} over "
                f"{canary.requests} requests is above {policy.max_error_rate}")  # fmt: skip
    if canary.ttft_p95_ms is None or base.ttft_p95_ms is None:
        return ""
    if canary.ttft_p95_ms > base.ttft_p95_ms * policy.max_ttft_p95_ratio:
        ratio = policy.max_ttft_p95_ratio
        return (
            f"TTFT p95 {canary.ttft_p95_ms:.0f} ms of {rollout.canary!r} is above "
            f"{ratio}x the baseline's {base.ttft_p95_ms:.0f} ms"
        )
    return ""


def merge_counts(reports: Iterable[WindowReport]) -> dict[str, VersionCounts]:
    """Every report's counts summed by version."""
    merged: dict[str, VersionCounts] = {}
    for report in reports:
        for version, counts in report.versions.items():
            total = merged.setdefault(version, VersionCounts())
            total.requests += counts.requests
            total.errors += counts.errors
            for bucket, count in enumerate(counts.ttft_buckets[: len(total.ttft_buckets)]):
                total.ttft_buckets[bucket] += count
    return merged


def figures_of(counts: VersionCounts | None) -> VersionFigures:
    """One version's requests, errors, error rate and TTFT p95."""
    if counts is None or counts.requests == 0:
        return VersionFigures()
    return VersionFigures(requests=counts.requests, errors=counts.errors,
                          error_rate=round(counts.errors / counts.requests, 4),
                          ttft_p95_ms=ttft_p95_ms(counts.ttft_buckets))  # fmt: skip


def ttft_p95_ms(buckets: list[int]) -> float | None:
    """The upper bound of the bucket that holds the 95th percentile (the last bound above)."""
    total = sum(buckets)
    if total == 0:
        return None
    seen = 0
    for bound, count in zip((*TTFT_BOUNDS_MS, TTFT_BOUNDS_MS[-1]), buckets, strict=False):
        seen += count
        if seen >= P95 * total:
            return float(bound)
    return float(TTFT_BOUNDS_MS[-1])
