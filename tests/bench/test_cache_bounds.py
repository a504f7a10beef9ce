"""The load floors ``bench.placement`` prints beside its figures (pure arithmetic, no cluster)."""

from bench._cache_bounds import load_bounds


def test_belady_evicts_what_comes_back_last() -> None:
    # two slots, three adapters in rotation: LRU misses all six; Belady keeps 0 for the
    # fourth request, then lets 0 go (never asked again) and keeps 2 for the sixth
    bounds = load_bounds([0, 1, 2, 0, 1, 2], slots=2, adapters=3, tail_from=2,
                         measured_from=0, measured_s=60)  # fmt: skip
    assert bounds.belady_per_min == 4
    assert bounds.belady_tail_miss_share == 0.5  # adapter 2: first request misses, second hits


def test_warm_up_requests_fill_the_cache_but_are_not_counted() -> None:
    bounds = load_bounds([-1, 0, 1, 0, 1], slots=2, adapters=2, tail_from=1,
                         measured_from=3, measured_s=30)  # fmt: skip
    assert bounds.belady_per_min == 0  # both adapters loaded during the warm-up
    assert bounds.best_online_per_min == 0  # every adapter fits: nothing to load


def test_best_online_loads_what_the_top_slots_leave_out() -> None:
    # weights 1, 1/2, 1/3: keeping the top one loads 5/11 of the measured adapter requests
    bounds = load_bounds([0] * 11, slots=1, adapters=3, tail_from=2, measured_from=0,
                         measured_s=60)  # fmt: skip
    assert bounds.best_online_per_min == round(5 / 11 * 11, 1)
