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


def split(rollout: Rollout, weight: int) -> list[AliasTarget]:
    """The targets with the canary at ``weight``: the alias's other targets as they were
    before the rollout, scaled to share the rest, and the canary last, so a session that
    reached it stays on it as its weight grows (``frontend.aliases.choose``)."""
    if weight == FULL:
        return [AliasTarget(model=rollout.canary, weight=FULL)]
    others = [target for target in _before(rollout) if target.model != rollout.canary]
    rest = _scaled(others, FULL - weight, rollout.baseline)
    return [*rest, AliasTarget(model=rollout.canary, weight=weight)]


def _before(rollout: Rollout) -> list[AliasTarget]:
    """The alias's targets before the rollout (the baseline alone in older records)."""
    return rollout.before or [AliasTarget(model=rollout.baseline, weight=FULL)]


def _scaled(targets: list[AliasTarget], total: int, baseline: str) -> list[AliasTarget]:
    """``targets`` with weights summing to ``total`` in their proportions (largest remainder,
    ties to the first listed); all of it on the baseline when none carries weight."""
    weights = [target.weight for target in targets]
    if not any(weights):
        weights = [int(target.model == baseline) for target in targets]
    whole = sum(weights)
    shares = [weight * total // whole for weight in weights]
    by_remainder = sorted(range(len(weights)), key=lambda i: -(weights[i] * total % whole))
    for i in by_remainder[: total - sum(shares)]:
        shares[i] += 1
    return [
        AliasTarget(model=target.model, weight=share)
        for target, share in zip(targets, shares, strict=True)
    ]


def start_rollout(current: Alias | None, request: RolloutRequest, now: float) -> Alias:
    """The alias with ``request``'s canary at its first weight and the policy running; its
    other targets keep their proportions in the rest."""
    before = current.targets if current is not None else []
    baseline = _baseline(before, request)
    steps = request.policy.steps
    weight = request.weight or (steps[0] if steps else DEFAULT_CANARY_WEIGHT)
    rollout = Rollout(baseline=baseline, canary=request.canary, policy=request.policy,
                      weight=weight, window_started_at=now, reason="started",
                      before=before)  # fmt: skip
    return Alias(name=request.alias, targets=split(rollout, weight), rollout=rollout)


def _baseline(before: list[AliasTarget], request: RolloutRequest) -> str:
    """``request``'s baseline, else the heaviest target but the canary. A baseline must be
    one of the alias's other targets: a rollback restores them, not the baseline alone."""
    others = [target for target in before if target.model != request.canary]
    baseline = request.baseline
    if baseline is None and others:
        return max(others, key=lambda target: target.weight).model
    if baseline is None:
        what = "does not exist" if not before else f"has no target but canary {request.canary!r}"
        raise ConflictError(f"alias {request.alias!r} {what}; name its current version as baseline")
    if before and baseline not in {target.model for target in others}:
        raise ConflictError(
            f"baseline {baseline!r} is not a target of alias {request.alias!r} (its targets "
            f"but the canary: {', '.join(target.model for target in others) or 'none'}); name "
            "one of them, or set the alias's targets first (POST /v1/aliases)"
        )
    return baseline


def promote(alias: Alias, *, full: bool, now: float, reason: str = "promoted by hand") -> Alias:
    """The next step's weight (or 100 with ``full``, or without steps); 100 ends it."""
    rollout = _running(alias)
    higher = [step for step in rollout.policy.steps if step > rollout.weight]
    weight = FULL if full or not higher else higher[0]
    phase = "promoted" if weight == FULL else "running"
    moved = msgspec.structs.replace(rollout, weight=weight, phase=phase, reason=reason,
                                    window_started_at=now, next_window=0)  # fmt: skip
    return msgspec.structs.replace(alias, targets=split(rollout, weight), rollout=moved)


def rollback(alias: Alias, reason: str, figures: RolloutFigures | None = None) -> Alias:
    """The alias's targets back as they were before the rollout; the rollout shows
    ``rolled_back``, why, and the figures."""
    rollout = _running(alias)
    back = msgspec.structs.replace(rollout, weight=0, phase="rolled_back", reason=reason,
                                   figures=figures or rollout.figures)  # fmt: skip
    return msgspec.structs.replace(alias, targets=_before(rollout), rollout=back)


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
