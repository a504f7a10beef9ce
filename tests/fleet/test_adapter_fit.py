"""Which instances can take an adapter: its rank read from visible files or learned from
refusals, against each instance's ``max_lora_rank`` (pure, but for the files it reads)."""

from __future__ import annotations

from pathlib import Path

from lorafleet.fleet.adapter_fit import RankCache, can_take, least_rank, unplaceable_reason
from tests.worker.adapters import make_adapter_dir

LIMITS = {1: 8, 2: 64, 3: 0}
"""Instance -> its ``max_lora_rank`` (3 says none)."""


def test_the_rank_of_a_visible_source_is_read_from_its_config(tmp_path: Path) -> None:
    ranks = RankCache()
    uri = f"file://{make_adapter_dir(tmp_path, 'wide', rank=32)}"
    assert ranks.rank(uri) == 32
    assert can_take(least_rank(ranks.rank(uri), []), LIMITS) == [2, 3]


def test_a_source_not_visible_here_is_learned_from_refusals(tmp_path: Path) -> None:
    ranks = RankCache()
    assert ranks.rank("s3://bucket/wide") == 0  # unknown: every instance may try
    assert ranks.rank(f"file://{tmp_path}/elsewhere") == 0  # on the workers' disks only
    assert can_take(least_rank(0, []), LIMITS) == [1, 2, 3]
    assert can_take(least_rank(0, [8]), LIMITS) == [2, 3]  # instance 1 refused it
    assert can_take(least_rank(0, [8, 64]), {1: 8, 2: 64}) == []


def test_unplaceable_says_the_rank_and_every_limit() -> None:
    reason = unplaceable_reason("huge", 128, {1: 8, 2: 64, 4: 8})
    assert "'huge' has rank 128 or more" in reason and "at most 8, 64" in reason
    assert "--max-lora-rank" in reason
