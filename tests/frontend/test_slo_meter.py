"""``SloMeter`` against a real etcd desired state: only adapters with targets are counted,
each request within or past each target, by window of a hand-moved clock."""

from __future__ import annotations

from lorafleet.frontend.desired_state import DesiredState
from lorafleet.frontend.slo_meter import SloMeter
from lorafleet.proto.adapters import AdapterSpec, LoraSource
from lorafleet.proto.slo import SloTargets, bucket_of
from tests.hand_clock import HandClock


def _spec(name: str, slo: SloTargets | None) -> AdapterSpec:
    return AdapterSpec(name=name, base_model="demo", source=LoraSource(uri="file:///a"), slo=slo)


async def test_counts_by_window_only_adapters_with_targets(etcd, namespace) -> None:
    desired = await DesiredState.start(etcd, namespace)
    try:
        await desired.apply(_spec("timed", SloTargets(ttft_p95_ms=300, itl_p95_ms=50)))
        await desired.apply(_spec("plain", None))
        clock = HandClock(now=1000.0)
        meter = SloMeter(desired, window_s=10, clock=clock)
        assert set(meter.targets()) == {"timed"}
        assert meter.window_now() == 100

        meter.observe("timed", ttft_s=0.1, itl_s=0.02)  # within both
        meter.observe("timed", ttft_s=0.8, itl_s=None)  # one token: TTFT alone judges it
        meter.observe("timed", ttft_s=0.2, itl_s=0.09)  # past the ITL target
        meter.observe("plain", ttft_s=5.0, itl_s=1.0)
        clock.now += 10
        meter.observe("timed", ttft_s=0.1, itl_s=0.01)

        ended = meter.take_before(meter.window_now())
        assert set(ended) == {100} and set(ended[100]) == {"timed"}
        counts = ended[100]["timed"]
        assert (counts.requests, counts.met, counts.ttft_met) == (3, 1, 2)
        assert (counts.itl_requests, counts.itl_met) == (2, 1)
        assert counts.ttft_buckets == {bucket_of(100): 1, bucket_of(800): 1, bucket_of(200): 1}
        assert meter.take_before(meter.window_now()) == {}  # taken once
        assert set(meter.take_before(meter.window_now() + 1)) == {101}

        await desired.delete("timed")
        assert meter.targets() == {}
    finally:
        await desired.aclose()
