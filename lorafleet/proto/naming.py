"""Names derived from an adapter's name: its etcd slug and vLLM's ``lora_int_id``.

Both are pure functions (of the name, and for the id of the version's digest) so that
every worker derives the same values without talking to anyone. Edit only together
with ARCHITECTURE.md.
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


def lora_id(name: str, digest: str = "") -> int:
    """Return the positive 31-bit id vLLM needs, the same for a version on every worker.

    ``digest`` is the version's content digest (``worker.lora.digest``): a changed adapter
    never shares an id, nor vLLM's prefix-cache entries, with its previous version
    (vLLM issue 42125). Without one the id is the name's alone.
    """
    key = name if not digest else f"{name}\0{digest}"
    hashed = blake3.blake3(key.encode()).digest()
    return (int.from_bytes(hashed[:8], "big") & LORA_ID_MASK) or 1
