"""Tests for the hf engine's text stream: whole UTF-8 characters and stop strings across tokens."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from lorafleet.launch.demo_model import DemoModelPaths
from lorafleet.worker.engines._hf_text import TextStream


@pytest.fixture(scope="session")
def tokenizer(demo: DemoModelPaths) -> Any:
    """The demo model's byte-level BPE tokenizer (it splits non-ASCII text into byte tokens)."""
    return AutoTokenizer.from_pretrained(demo.base)


def stream_all(tokenizer: Any, text: str, stop: list[str]) -> tuple[list[str], TextStream]:
    stream = TextStream(tokenizer, stop)
    deltas = []
    for token in tokenizer.encode(text):
        deltas.append(stream.push(token))
        if stream.stopped:
            break
    deltas.append(stream.flush())
    return deltas, stream


def test_multibyte_characters_arrive_whole(tokenizer: Any) -> None:
    text = "héllo wörld 🙂 日本"
    assert len(tokenizer.encode(text)) > len(text.split())
    deltas, _ = stream_all(tokenizer, text, [])
    assert "".join(deltas) == text
    assert not any("\ufffd" in delta for delta in deltas)


def test_stop_string_spanning_tokens_is_cut_and_never_sent(tokenizer: Any) -> None:
    deltas, stream = stream_all(tokenizer, "beep boop. i am a robot. beep.", ["a rob"])
    assert "".join(deltas) == "beep boop. i am "
    assert stream.stopped


def test_text_that_only_starts_like_a_stop_string_is_released(tokenizer: Any) -> None:
    deltas, stream = stream_all(tokenizer, "hello! i am a tiny model.", ["tiny robot"])
    assert "".join(deltas) == "hello! i am a tiny model."
    assert not stream.stopped


def test_earliest_of_several_stop_strings_wins(tokenizer: Any) -> None:
    deltas, _ = stream_all(tokenizer, "one, two, three, four, five.", ["four", "two"])
    assert "".join(deltas) == "one, "
