"""The body bounds' pure checks: JSON nesting and shortened echoes."""

from __future__ import annotations

import msgspec
import pytest

from lorafleet.proto.errors import InvalidRequestError
from lorafleet.proto.limits import MAX_JSON_DEPTH, MAX_SHOWN_CHARS, check_json_depth, shorten


def _nested(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * depth + close * depth


@pytest.mark.parametrize(
    "raw",
    [
        _nested(MAX_JSON_DEPTH),
        b'{"a":' * (MAX_JSON_DEPTH - 1) + b"[]" + b"}" * (MAX_JSON_DEPTH - 1),
        b'{"text": "' + b"[{" * 10_000 + b'"}',  # brackets inside a string do not nest
        b'["\\"' + b"[" * 100 + b'"]',  # nor after an escaped quote
        b"[" + b"[]," * 10_000 + b"[]]",  # many brackets, little depth
        (b"[" * 40 + b"]" * 40) * 50,  # many deep siblings, each within the limit
        b'{"model": "demo", "messages": [' + b"{}," * 100,  # truncated: the decoder says so
    ],
)
def test_bodies_within_the_depth_limit_pass(raw: bytes) -> None:
    check_json_depth(raw)


@pytest.mark.parametrize(
    "raw",
    [
        _nested(MAX_JSON_DEPTH + 1),
        _nested(10_000, b'{"a":', b"}"),
        b"[[]" * 70 + b"]" * 70,  # depth without one long run of openers
        b"[" * 10_000,  # truncated, but opened too much
        b'{"text": "x", "deep": ' + _nested(5_000) + b"}",
    ],
)
def test_deeper_bodies_are_invalid_requests_naming_the_limit(raw: bytes) -> None:
    with pytest.raises(InvalidRequestError, match=f"more than {MAX_JSON_DEPTH} levels deep"):
        check_json_depth(raw)


def test_whatever_passes_the_check_decodes_without_recursing_away() -> None:
    for depth in (MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH):
        raw = _nested(depth)
        check_json_depth(raw)
        assert msgspec.json.decode(raw) is not None


def test_shorten_keeps_short_text_and_notes_the_length_of_long_text() -> None:
    assert shorten("pirate") == "pirate"
    long = "file:///" + "a" * 900_000
    shown = shorten(long)
    assert shown.startswith("file:///aaa") and "(900008 characters)" in shown
    assert len(shown) < MAX_SHOWN_CHARS + 40
