"""Names derived from an adapter's name: its etcd slug and vLLM's ``lora_int_id``.

Both are pure functions of the name so that every worker derives the same
values without talking to anyone. Edit only together with ARCHITECTURE.md.
"""

from __future__ import annotations

import re
from typing import Final

import blake3

__all__ = ["LORA_ID_MASK", "lora_id", "lora_slug"]

LORA_ID_MASK: Final = 0x7FFFFFFF
_UNSAFE_SLUG_CHARS: Final = re.compile(r"[^a-z0-9_]")


def lora_slug(name: str) -> str:
    """Return the etcd key segment for an adapter: readable, and unique by its hash suffix."""
    readable = _UNSAFE_SLUG_CHARS.sub("_", name.lower())
    return f"{readable}_{blake3.blake3(name.encode()).hexdigest()[-8:]}"


def lora_id(name: str) -> int:
    """Return the positive 31-bit id vLLM needs, the same for a name on every worker."""
    digest = blake3.blake3(name.encode()).digest()
    return (int.from_bytes(digest[:8], "big") & LORA_ID_MASK) or 1
