"""Read what ``etcdctl get --print-value-only`` prints: indented JSON records, one after another."""

from __future__ import annotations

import json
from typing import Any


def json_values(output: str) -> list[Any]:
    """Every JSON value in ``output``, in order (records span several lines)."""
    decoder, values, rest = json.JSONDecoder(), [], output.strip()
    while rest:
        value, end = decoder.raw_decode(rest)
        values.append(value)
        rest = rest[end:].strip()
    return values
