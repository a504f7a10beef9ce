"""Prompts sent lately to instances the index follows: held there until their events come."""

from __future__ import annotations

from collections.abc import Iterator

from lorafleet.fleet.kv_blocks import BlockChain, iter_words_tokens
from lorafleet.frontend.kv.recent_sends import RecentSends
from tests.hand_clock import HandClock

SYSTEM = " ".join(f"rule{n}" for n in range(160))


def _chain(text: str, version: str = "demo") -> BlockChain:
    return BlockChain(iter_words_tokens([text], 16), 16, version)


def test_a_prompt_sent_lately_is_held_where_it_went_for_its_shared_blocks() -> None:
    clock = HandClock()
    recent = RecentSends(window_s=5, clock=clock)
    recent.remember(_chain(f"{SYSTEM} first question"), 7)
    asked = _chain(f"{SYSTEM} another question")
    assert recent.held_blocks(asked, {7, 8}) == {7: 160 // 16}
    assert recent.held_blocks(_chain(f"{SYSTEM} q", "demo@sha256:2"), {7}) == {}
    clock.now += 5.5  # by now its events have come, or it is not held
    assert recent.held_blocks(asked, {7}) == {}


def test_a_send_not_asked_for_within_the_window_is_forgotten() -> None:
    clock = HandClock()
    recent = RecentSends(window_s=5, clock=clock)
    recent.remember(_chain(f"{SYSTEM} first question"), 7)
    clock.now += 5.5
    recent.remember(_chain("an unrelated prompt " * 10), 8)
    assert recent.held_blocks(_chain(f"{SYSTEM} another question"), {7}) == {}


def test_a_prompt_no_send_starts_like_costs_one_block_of_tokens() -> None:
    recent = RecentSends()
    recent.remember(_chain(f"{SYSTEM} first question"), 7)
    read: list[int] = []

    def chunks() -> Iterator[list[int]]:
        for start in range(0, 640, 16):
            read.append(start)
            yield list(range(start, start + 16))

    assert recent.held_blocks(BlockChain(chunks(), 16, "demo"), {7}) == {}
    assert read == [0]


def test_past_the_bound_the_oldest_sends_go_first() -> None:
    recent = RecentSends(max_sends=2)
    recent.remember(_chain(f"{SYSTEM} one"), 1)
    recent.remember(_chain(f"other {SYSTEM} two"), 2)
    recent.remember(_chain(f"third {SYSTEM} three"), 3)
    assert recent.held_blocks(_chain(f"{SYSTEM} again"), {1}) == {}
    assert recent.held_blocks(_chain(f"third {SYSTEM} again"), {3}) == {3: 10}
