"""The bounds every request body obeys, and the pure checks that enforce what ``Meta`` cannot.

A client mistake must be a 4xx, never a 5xx: these bounds keep every body inside
what msgspec can decode without recursing away, what msgpack can carry to a
worker, and what an error message can repeat. Field bounds themselves are
``msgspec.Meta`` constraints on the Structs (so ``/openapi.json`` shows them);
they use the constants here. Pure checks, no I/O.
"""

from __future__ import annotations

import itertools
import operator
import re
from typing import Final

from lorafleet.proto.errors import InvalidRequestError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_JSON_DEPTH",
    "MAX_LIST_ITEMS",
    "MAX_MODEL_NAME_CHARS",
    "MAX_SAFE_INT",
    "MAX_SHORT_TEXT_CHARS",
    "MAX_SHOWN_CHARS",
    "MAX_TOKENS_LIMIT",
    "MAX_URI_CHARS",
    "check_json_depth",
    "shorten",
]

MAX_JSON_DEPTH: Final = 64
"""Deepest nesting of arrays and objects a body may have; real bodies need fewer than 10,
tool schemas a few dozen. msgspec recurses once per level, so deeper JSON could exhaust
the interpreter's stack (a ``RecursionError``, once a 500)."""

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
"""``seed``'s range: vLLM's, and inside what msgpack carries (-2**63 .. 2**64 - 1)."""

MAX_SAFE_INT: Final = 2**53 - 1
"""Largest count or limit a stored record accepts (tenants' limits, rollouts' requests): every
JSON reader keeps it exact (JavaScript's ``Number.MAX_SAFE_INTEGER``), and so does a float."""

MAX_TOKENS_LIMIT: Final = 2**31 - 1
"""Largest ``max_tokens`` accepted; the model's context length usually refuses far less."""

MAX_MODEL_NAME_CHARS: Final = 512
"""Longest model or base model name (a served name or a path to a checkpoint)."""

MAX_URI_CHARS: Final = 4096
"""Longest adapter source URI; presigned S3 URLs with session tokens stay under 3,000."""

MAX_SHORT_TEXT_CHARS: Final = 256
"""Longest short free text: a chat turn's ``name``, ``user``, a content part's ``type``."""

MAX_LIST_ITEMS: Final = 4096
"""Most items in a list of a body (chat turns, content parts)."""

MAX_SHOWN_CHARS: Final = 256
"""Most characters of a caller's text that an error message repeats."""

_JSON_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPEN_CLOSE: Final = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS: Final = bytes(set(range(256)) - set(b"[]{}"))
_RUN: Final = re.compile(rb"\(+|\)+")
_SHRINKING_PASSES: Final = 4


def check_json_depth(raw: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise ``InvalidRequestError`` if the JSON text ``raw`` nests deeper than ``limit``.

    Runs before any decoder sees ``raw``, mostly at C speed: brackets inside strings
    do not count, and a truncated body counts what it opened.
    """
    if raw.count(b"[") + raw.count(b"{") > limit and _nesting_exceeds(raw, limit):
        raise InvalidRequestError(
            f"request body nests arrays and objects more than {limit} levels deep; "
            "flatten it (the limit guards the JSON decoder)"
        )


def _nesting_exceeds(raw: bytes, limit: int) -> bool:
    """Whether any prefix of ``raw`` holds more than ``limit`` open brackets."""
    brackets = _JSON_STRING.sub(b"", raw).translate(_OPEN_CLOSE, _NOT_BRACKETS)
    # Each pass removes the innermost pairs, which lowers the deepest nesting by exactly
    # one level and leaves far fewer runs of brackets for the Python-level sum below.
    for _ in range(_SHRINKING_PASSES):
        if b"(" * (limit + 1) in brackets:
            return True
        shorter = brackets.replace(b"()", b"")
        if len(shorter) == len(brackets):
            break
        brackets, limit = shorter, limit - 1
    runs = list(map(len, _RUN.findall(brackets.lstrip(b")"))))  # "((", ")))", "(", ...
    runs[1::2] = map(operator.neg, runs[1::2])
    return next(filter(limit.__lt__, itertools.accumulate(runs)), None) is not None


def shorten(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters with its full length noted, for error messages."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"
