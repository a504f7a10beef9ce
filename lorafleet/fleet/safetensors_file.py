"""Tell, from its bytes alone, whether a file is a whole safetensors file: no torch, no library.

It reads the 8-byte header length and the JSON header (never the tensors' data) and
holds every tensor's ``data_offsets`` against the file's real size, as the safetensors
library does before it maps a byte: what passes here is what an engine can load.
It must not judge the tensors' names or values: those are the engine's business.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, Final

__all__ = ["SAFETENSORS_HEADER_MAX_BYTES", "safetensors_problem"]

SAFETENSORS_HEADER_MAX_BYTES: Final = 100_000_000
"""The safetensors library's own limit (``MAX_HEADER_SIZE``); a longer header is no header."""
LENGTH_BYTES: Final = 8
"""The little-endian u64 that opens the file: the header's length in bytes."""
DTYPE_BITS: Final = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4,
    "F6_E2M3": 6, "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32,
    "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}  # fmt: skip
"""Bits per element of the dtypes whose tensors' byte length is checked against their shape
(a dtype added to safetensors later is checked for its offsets only)."""


def safetensors_problem(weights: Path) -> str | None:
    """Return why ``weights`` is not a whole safetensors file, or None when it is one."""
    name, size = weights.name, weights.stat().st_size
    with weights.open("rb") as handle:
        prefix = handle.read(LENGTH_BYTES)
        if len(prefix) < LENGTH_BYTES:
            return _not_safetensors(name, f"{size} bytes: no room for its header's length")
        (header_len,) = struct.unpack("<Q", prefix)
        if not 0 < header_len <= SAFETENSORS_HEADER_MAX_BYTES:
            return _not_safetensors(
                name, f"its first 8 bytes declare a header of {header_len} bytes, not 1 to "
                f"{SAFETENSORS_HEADER_MAX_BYTES}",
            )  # fmt: skip
        raw = handle.read(min(header_len, size - LENGTH_BYTES))
    if not raw.startswith(b"{"):
        return _not_safetensors(name, "its header is not a JSON object")
    if len(raw) < header_len:
        return f"{name} is truncated (in its header)"
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return _not_safetensors(name, f"its header is not valid JSON ({type(exc).__name__})")
    if not isinstance(header, dict):
        return _not_safetensors(name, "its header is not a JSON object")
    return _tensors_problem(name, header, size=size, data_start=LENGTH_BYTES + header_len)


def _tensors_problem(
    name: str, header: dict[str, Any], *, size: int, data_start: int
) -> str | None:
    """Why the tensors the header lists do not tile the bytes after it exactly, or None."""
    spans: list[tuple[int, int, str]] = []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        span = _span(info)
        if span is None:
            return _not_safetensors(
                name, f"tensor {key!r} has no valid dtype, shape and data_offsets"
            )
        spans.append((*span, key))
    claimed = data_start + max((end for _, end, _ in spans), default=0)
    if claimed > size:
        return f"{name} is truncated, or its header lies ({size} of the {claimed} bytes it claims)"
    position = 0
    for begin, end, key in sorted(spans):
        if begin != position:
            return _not_safetensors(
                name, f"tensor {key!r} does not start where the one before ends"
            )
        position = end
    if data_start + position != size:
        return _not_safetensors(
            name, f"{size - data_start - position} bytes follow its last tensor"
        )
    return None


def _span(info: object) -> tuple[int, int] | None:
    """A tensor's ``(begin, end)`` in the data, when its entry is well formed and its byte
    length is what its dtype and shape make; else None."""
    if not isinstance(info, dict) or not isinstance(info.get("dtype"), str):
        return None
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not (isinstance(shape, list) and all(_count(d) for d in shape)):
        return None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)):
        return None
    begin, end = offsets
    bits = DTYPE_BITS.get(info["dtype"])
    if begin > end or (bits is not None and math.prod(shape) * bits != (end - begin) * 8):
        return None
    return begin, end


def _count(value: object) -> bool:
    """Whether ``value`` is a non-negative JSON integer (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _not_safetensors(name: str, why: str) -> str:
    return f"{name} is not a safetensors file ({why})"
