"""A rollout's transitions and the alias split, in-process: pure functions fed records."""

from __future__ import annotations

import collections

import pytest

from lorafleet.frontend.aliases import choose
from lorafleet.frontend.rollout import judge, promote, rollback, start_rollout, ttft_p95_ms
from lorafleet.proto.aliases import (
    TTFT_BOUNDS_MS,
    Alias,
    AliasTarget,
    RolloutPolicy,
    RolloutRequest,
    VersionCounts,
    WindowReport,
    validate_alias_shape,
)
from lorafleet.proto.errors import ConflictError, InvalidRequestError

BASE = Alias(name="bot", targets=[AliasTarget(model="v1", weight=100)])


def _counts(requests: int, errors: int = 0, ttft_ms: float = 20.0) -> VersionCounts:
    counts = VersionCounts(requests=requests, errors=errors)
    bucket = next(i for i, bound in enumerate(TTFT_BOUNDS_MS) if ttft_ms <= bound)
    counts.ttft_buckets[bucket] = requests - errors
    return counts


def _report(alias: Alias, **versions: VersionCounts) -> WindowReport:
    assert alias.rollout is not None
    return WindowReport(alias=alias.name, window_started_at=alias.rollout.window_started_at,
                        window=alias.rollout.next_window, versions=versions)  # fmt: skip


def _started(**policy: object) -> Alias:
    request = RolloutRequest(alias="bot", canary="v2", policy=RolloutPolicy(**policy))  # type: ignore[arg-type]
    return start_rollout(BASE, request, now=1000.0)


def test_a_rollout_starts_at_its_first_step_with_the_canary_last() -> None:
    alias = _started(steps=[5, 50, 100])
    assert alias.targets == [AliasTarget(model="v1", weight=95), AliasTarget(model="v2", weight=5)]
    assert alias.rollout is not None and alias.rollout.baseline == "v1"


def test_a_rollout_scales_the_other_targets_and_a_rollback_restores_them_exactly() -> None:
    r9 = Alias(name="r9", targets=[AliasTarget(model="v1", weight=80),
                                   AliasTarget(model="v4", weight=20)])  # fmt: skip
    policy = RolloutPolicy(steps=[10, 50, 100])
    started = start_rollout(r9, RolloutRequest(alias="r9", canary="bad3", policy=policy), 1.0)
    assert [(t.model, t.weight) for t in started.targets] == [
        ("v1", 72), ("v4", 18), ("bad3", 10),
    ]  # fmt: skip
    assert started.rollout is not None and started.rollout.baseline == "v1"
    stepped = promote(started, full=False, now=2.0)
    assert [(t.model, t.weight) for t in stepped.targets] == [("v1", 40), ("v4", 10), ("bad3", 50)]
    assert rollback(stepped, "bad").targets == r9.targets
    odd = Alias(name="r9", targets=[AliasTarget(model=m, weight=w) for m, w in
                                    (("v1", 34), ("v2", 33), ("v4", 33))])  # fmt: skip
    shares = start_rollout(odd, RolloutRequest(alias="r9", canary="v4", weight=7), 1.0).targets
    assert [(t.model, t.weight) for t in shares] == [("v1", 47), ("v2", 46), ("v4", 7)]
    with pytest.raises(ConflictError, match="'v9' is not a target of alias 'r9'"):
        start_rollout(r9, RolloutRequest(alias="r9", canary="bad3", baseline="v9"), 1.0)


def test_a_window_summed_over_frontends_above_the_error_rate_rolls_back() -> None:
    alias = _started(max_error_rate=0.1, min_requests=10)
    reports = [_report(alias, v1=_counts(90), v2=_counts(6, errors=2)) for _ in range(2)]
    judged = judge(alias, reports, now=1100.0)
    assert judged.targets == [AliasTarget(model="v1", weight=100)]
    assert judged.rollout is not None and judged.rollout.phase == "rolled_back"
    assert judged.rollout.figures is not None
    assert (judged.rollout.figures.frontends, judged.rollout.figures.canary.requests) == (2, 12)
    assert "error rate 0.333" in judged.rollout.reason


def test_a_canary_slower_than_the_ratio_rolls_back() -> None:
    alias = _started(max_ttft_p95_ratio=1.5, min_requests=5)
    report = _report(alias, v1=_counts(50, ttft_ms=20), v2=_counts(10, ttft_ms=200))
    judged = judge(alias, [report], now=1100.0)
    assert judged.rollout is not None and judged.rollout.phase == "rolled_back"
    assert "TTFT p95 200 ms" in judged.rollout.reason


def test_too_few_canary_requests_wait_for_the_next_window() -> None:
    alias = _started(min_requests=50)
    judged = judge(alias, [_report(alias, v2=_counts(10, errors=10))], now=1100.0)
    assert judged.targets == alias.targets
    assert judged.rollout is not None and judged.rollout.phase == "running"
    assert (judged.rollout.next_window, judged.rollout.windows) == (1, 1)
    assert judged.rollout.reason.startswith("waiting")


def test_reports_of_another_window_are_not_counted() -> None:
    alias = _started(min_requests=1)
    stale = WindowReport(
        alias="bot", window_started_at=1.0, window=0, versions={"v2": _counts(9, 9)}
    )
    judged = judge(alias, [stale], now=1100.0)
    assert judged.rollout is not None and judged.rollout.phase == "running"


def test_healthy_windows_promote_step_by_step_to_the_canary() -> None:
    alias = _started(steps=[10, 50, 100], min_requests=1)
    middle = judge(alias, [_report(alias, v1=_counts(9), v2=_counts(1))], now=1100.0)
    assert [t.weight for t in middle.targets] == [50, 50]
    assert middle.rollout is not None and middle.rollout.next_window == 0
    done = judge(middle, [_report(middle, v1=_counts(5), v2=_counts(5))], now=1200.0)
    assert done.targets == [AliasTarget(model="v2", weight=100)]
    assert done.rollout is not None and done.rollout.phase == "promoted"


def test_promote_and_rollback_need_a_running_rollout() -> None:
    rolled = rollback(_started(), "by hand")
    with pytest.raises(ConflictError, match="rolled_back"):
        promote(rolled, full=True, now=0.0)
    with pytest.raises(ConflictError, match="no rollout"):
        rollback(BASE, "again")


def test_p95_is_the_bound_of_the_bucket_holding_it() -> None:
    buckets = [0] * (len(TTFT_BOUNDS_MS) + 1)
    buckets[1], buckets[5] = 94, 6
    assert ttft_p95_ms(buckets) == TTFT_BOUNDS_MS[5]
    assert ttft_p95_ms([0] * len(buckets)) is None


def test_a_session_always_picks_the_same_target_and_keeps_the_canary_as_it_grows() -> None:
    small = [AliasTarget(model="v1", weight=90), AliasTarget(model="v2", weight=10)]
    large = [AliasTarget(model="v1", weight=50), AliasTarget(model="v2", weight=50)]
    sessions = [f"s{i}" for i in range(1000)]
    first = {s: choose("bot", small, s) for s in sessions}
    assert first == {s: choose("bot", small, s) for s in sessions}
    assert all(choose("bot", large, s) == "v2" for s in sessions if first[s] == "v2")
    shares = collections.Counter(first.values())
    assert 50 <= shares["v2"] <= 150


@pytest.mark.parametrize(
    ("weights", "words"),
    [([60, 30], "sum to 90"), ([-5, 105], "use 0 to 100"), ([100, 0, 0], "twice")],
)
def test_weights_are_checked(weights: list[int], words: str) -> None:
    names = ["v1", "v2", "v2"][: len(weights)]
    targets = [AliasTarget(model=n, weight=w) for n, w in zip(names, weights, strict=True)]
    with pytest.raises(InvalidRequestError, match=words):
        validate_alias_shape("bot", targets)
