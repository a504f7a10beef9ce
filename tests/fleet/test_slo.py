"""Judging latency targets: the frontends' windows add up, a miss with demand adds one copy
at a time, and placement keeps the copies only while the adapter has demand."""

from __future__ import annotations

from lorafleet.fleet.slo import (
    SETTLE_WINDOWS,
    attainment_of,
    merge_reports,
    miss_reason,
    next_slo_copies,
    p95_ms,
    slo_floor,
)
from lorafleet.proto.slo import (
    SLO_BOUNDS_MS,
    SloCopies,
    SloCounts,
    SloReport,
    SloTargets,
    bucket_of,
)

TTFT_300 = SloTargets(ttft_p95_ms=300)


def _counts(ttft_ms: list[float], target_ms: float = 300) -> SloCounts:
    counts = SloCounts()
    for ms in ttft_ms:
        within = ms <= target_ms
        counts.requests += 1
        counts.ttft_met += within
        counts.met += within
        counts.ttft_buckets[bucket_of(ms)] = counts.ttft_buckets.get(bucket_of(ms), 0) + 1
    return counts


def _judge(counts: SloCounts, *, current: SloCopies | None = None, live: int = 1,
           most: int = 4, window: int = 10) -> SloCopies | None:  # fmt: skip
    return next_slo_copies("pirate", counts, TTFT_300, current=current, live=live, most=most,
                           window=window, min_requests=10)  # fmt: skip


def test_reports_of_one_window_add_up_and_others_are_left_out() -> None:
    one = SloReport(window_s=10, window=7, adapters={"pirate": _counts([100] * 10)})
    two = SloReport(window_s=10, window=7, adapters={"pirate": _counts([800] * 10)})
    old = SloReport(window_s=10, window=6, adapters={"pirate": _counts([100] * 50)})
    other_length = SloReport(window_s=5, window=7, adapters={"pirate": _counts([100] * 50)})
    merged = merge_reports([one, two, old, other_length], window_s=10, window=7)
    assert (merged["pirate"].requests, merged["pirate"].met) == (20, 10)
    assert sum(merged["pirate"].ttft_buckets.values()) == 20
    assert one.adapters["pirate"].requests == 10  # the reports themselves are unchanged


def test_p95_is_the_upper_bound_of_its_bucket_within_ten_percent() -> None:
    assert p95_ms({}) is None
    p95 = p95_ms(_counts([100] * 95 + [5000] * 5).ttft_buckets)
    assert p95 is not None and 100 <= p95 <= 110
    p95 = p95_ms(_counts([100] * 90 + [812] * 10).ttft_buckets)
    assert p95 is not None and 812 <= p95 <= 812 * 1.1
    assert p95_ms({len(SLO_BOUNDS_MS): 3}) == SLO_BOUNDS_MS[-1]  # past the last bound


def test_a_target_is_missed_when_fewer_than_95_percent_are_within_it() -> None:
    assert miss_reason(_counts([100] * 95 + [900] * 5), TTFT_300) == ""
    reason = miss_reason(_counts([100] * 90 + [812] * 10), TTFT_300)
    assert reason.startswith("ttft p95 8") and reason.endswith("ms > target 300 ms")
    itl = SloCounts(requests=10, met=0, ttft_met=10, itl_requests=10, itl_met=0,
                    itl_buckets={bucket_of(90): 10})  # fmt: skip
    assert miss_reason(itl, SloTargets(ttft_p95_ms=300, itl_p95_ms=50)).startswith("itl p95 9")


def test_a_miss_with_demand_adds_one_copy_to_the_live_ones() -> None:
    step = _judge(_counts([800] * 20), live=1, window=10)
    assert step is not None
    assert (step.copies, step.window) == (2, 10)
    assert step.reason.startswith("ttft p95 8")


def test_no_copy_without_enough_requests_or_without_a_miss_or_past_max_replicas() -> None:
    assert _judge(_counts([800] * 9)) is None  # under min_requests: no demand to speak of
    assert _judge(_counts([100] * 20)) is None
    assert _judge(_counts([800] * 20), live=4, most=4) is None


def test_the_next_copy_waits_for_the_last_to_be_live_and_a_window_after_it() -> None:
    added = SloCopies(name="pirate", copies=2, reason="ttft p95 869 ms > target 300 ms", window=10)
    missing = _counts([800] * 20)
    assert _judge(missing, current=added, live=2, window=10 + SETTLE_WINDOWS - 1) is None
    assert _judge(missing, current=added, live=1, window=20) is None  # copy 2 still loading
    step = _judge(missing, current=added, live=2, window=10 + SETTLE_WINDOWS)
    assert step is not None and step.copies == 3


def test_the_added_copies_hold_only_while_the_adapter_has_demand() -> None:
    added = SloCopies(name="pirate", copies=2, reason="why", window=1)
    assert slo_floor(added, demand_rps=3.0, in_use_rps=0.1) == 2
    assert slo_floor(added, demand_rps=0.05, in_use_rps=0.1) == 0
    assert slo_floor(None, demand_rps=3.0, in_use_rps=0.1) == 0


def test_attainment_shows_the_share_within_targets_and_why_copies_were_added() -> None:
    added = SloCopies(name="pirate", copies=2, reason="ttft p95 869 ms > target 300 ms", window=1)
    shown = attainment_of(_counts([100] * 15 + [800] * 5), window_s=10, copies=added)
    assert (shown.requests, shown.attainment, shown.copies) == (20, 0.75, 2)
    assert shown.reason == added.reason and shown.ttft_p95_ms is not None
    empty = attainment_of(None, window_s=10)
    assert (empty.requests, empty.attainment, empty.copies, empty.reason) == (0, None, 0, "")
