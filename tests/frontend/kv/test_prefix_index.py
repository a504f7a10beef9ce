"""The prefix index: stores, removals by block, version and instance, overlap, the bound."""

from __future__ import annotations

import pytest

from lorafleet.fleet.kv_blocks import block_hashes, words_tokens
from lorafleet.frontend.kv.prefix_index import PrefixIndex
from lorafleet.proto.kv_events import BlocksRemoved, BlocksStored, VersionCleared

PROMPT = words_tokens(["word " * 64])


def _chain(version: str, salt: str = "") -> list[int]:
    return block_hashes(PROMPT, 16, version, salt)


def test_overlap_counts_leading_blocks_each_instance_holds() -> None:
    index, chain = PrefixIndex(), _chain("demo")
    index.apply(1, [BlocksStored(version="demo", hashes=chain)])
    index.apply(2, [BlocksStored(version="demo", hashes=chain[:2])])
    assert index.overlaps(chain, {1, 2, 3}) == {1: 4, 2: 2}
    assert index.overlaps(chain, {2}) == {2: 2}


def test_a_block_of_one_version_or_salt_never_counts_for_another() -> None:
    index = PrefixIndex()
    index.apply(1, [BlocksStored(version="a@sha256:1", hashes=_chain("a@sha256:1"))])
    assert index.overlaps(_chain("a@sha256:2"), {1}) == {}
    assert index.overlaps(_chain("demo"), {1}) == {}
    assert index.overlaps(_chain("a@sha256:1", salt="tenant"), {1}) == {}


def test_removed_blocks_end_the_overlap_where_they_were() -> None:
    index, chain = PrefixIndex(), _chain("demo")
    index.apply(1, [BlocksStored(version="demo", hashes=chain),
                    BlocksRemoved(version="demo", hashes=chain[2:3])])  # fmt: skip
    assert index.overlaps(chain, {1}) == {1: 2}
    assert index.size == 3


def test_a_cleared_version_leaves_the_instances_other_versions() -> None:
    index = PrefixIndex()
    index.apply(1, [BlocksStored(version="a@d1", hashes=_chain("a@d1")),
                    BlocksStored(version="demo", hashes=_chain("demo"))])  # fmt: skip
    index.apply(2, [BlocksStored(version="a@d1", hashes=_chain("a@d1"))])
    index.apply(1, [VersionCleared(version="a@d1")])
    assert index.overlaps(_chain("a@d1"), {1, 2}) == {2: 4}
    assert index.overlaps(_chain("demo"), {1}) == {1: 4}
    assert index.blocks_of(1, "a@d1") == 0


def test_an_instance_removed_or_reset_takes_every_block_out() -> None:
    index = PrefixIndex()
    index.apply(1, [BlocksStored(version="demo", hashes=_chain("demo"))])
    index.apply(2, [BlocksStored(version="demo", hashes=_chain("demo"))])
    index.remove_instance(1)
    index.apply(2, [VersionCleared(version="")])
    assert index.size == 0
    assert index.instances() == set()
    assert index.overlaps(_chain("demo"), {1, 2}) == {}


def test_a_snapshot_replaces_what_the_instance_held() -> None:
    index = PrefixIndex()
    index.apply(1, [BlocksStored(version="a@d1", hashes=_chain("a@d1"))])
    index.replace(1, {"demo": _chain("demo")[:1]})
    assert index.overlaps(_chain("a@d1"), {1}) == {}
    assert index.overlaps(_chain("demo"), {1}) == {1: 1}
    assert index.size == 1


def test_a_flood_of_distinct_prefixes_stays_within_the_bound() -> None:
    index = PrefixIndex(max_blocks=100)
    for n in range(1_000):
        index.apply(n % 4, [BlocksStored(version="demo", hashes=_chain("demo", salt=str(n)))])
    assert index.size == 100
    assert index.dropped == 4_000 - 100
    index.remove_instance(0)
    index.apply(9, [BlocksStored(version="demo", hashes=_chain("demo"))])
    assert index.overlaps(_chain("demo"), {9}) == {9: 4}  # room again once blocks left


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_blocks"):
        PrefixIndex(max_blocks=0)
