"""The fleet's block hashes made lazily: the same numbers as ``block_hashes``, however the
tokens arrive, and no more tokens read than a reader needs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lorafleet.fleet.kv_blocks import (
    BlockChain,
    block_hashes,
    iter_words_tokens,
    words_count,
    words_tokens,
)

LONG = " ".join(f"word{n}" for n in range(600))
CHAT = [LONG, "  and\tthen \n a question ", LONG[:500]]


@pytest.mark.parametrize("first_words", [1, 5, 16, 64])
@pytest.mark.parametrize("block_size", [4, 16])
def test_a_chain_names_every_block_as_the_workers_do(first_words: int, block_size: int) -> None:
    tokens = words_tokens(CHAT)
    assert [t for chunk in iter_words_tokens(CHAT, first_words) for t in chunk] == tokens
    expected = block_hashes(tokens, block_size, "pirate@sha256:1", "tenant")
    chain = BlockChain(iter_words_tokens(CHAT, first_words), block_size, "pirate@sha256:1",
                       "tenant")  # fmt: skip
    assert chain.first() == expected[0]
    assert list(chain) == expected
    assert list(chain) == expected  # read again: the same, from what was hashed
    assert list(BlockChain([tokens], block_size, "pirate@sha256:1", "tenant")) == expected


def test_a_prompt_shorter_than_a_block_has_no_blocks() -> None:
    chain = BlockChain(iter_words_tokens(["three short words"]), 16, "demo")
    assert chain.first() is None
    assert list(chain) == []


def test_a_reader_that_stops_at_the_first_block_tokenizes_no_further() -> None:
    read: list[int] = []

    def chunks() -> Iterator[list[int]]:
        for start in range(0, 600, 8):
            read.append(start)
            yield list(range(start, start + 8))

    chain = BlockChain(chunks(), 16, "demo")
    assert chain.first() == block_hashes(list(range(16)), 16, "demo")[0]
    assert read == [0, 8]
    assert len(list(chain)) == 600 // 16
    assert len(read) == 600 // 8


@pytest.mark.parametrize(
    "texts",
    [[], [""], ["  "], ["one"], [" two  words "], ["tab\tnew\nline\rvt\x0bff\x0cend"],
     ["\x1c\xa0é\u2003 are not spaces to bytes.split"], CHAT],
)  # fmt: skip
def test_counting_words_gives_as_many_as_the_tokenizer_makes(texts: list[str]) -> None:
    assert words_count(texts) == len(words_tokens(texts))
