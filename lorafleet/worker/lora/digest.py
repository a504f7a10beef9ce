"""An adapter's content digest: the one identity of a version of its weights.

sha256 over ``adapter_config.json`` and the weight file, in a stable order, each file framed
by its name and size so that moving bytes between files changes the digest. Computed once,
when an adapter lands in the cache; the card, the listings and vLLM's ``lora_int_id`` carry
it, and an expected ``sha256`` from a caller is compared with it.
"""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path
from typing import Final

from lorafleet.fleet.adapter_files import ADAPTER_CONFIG, ADAPTER_WEIGHTS

__all__ = ["DIGEST_PREFIX", "content_digest"]

DIGEST_PREFIX: Final = "sha256:"
_CHUNK_BYTES: Final = 1 << 20


def content_digest(path: Path) -> str:
    """``sha256:<hex>`` of the adapter directory ``path``'s config and weight files.

    Only the files an engine reads count (a README or a tokenizer beside them does not), in
    the order ``adapter_config.json``, then the weights. ``OSError`` when one cannot be read;
    ``FileNotFoundError`` when the config or every weight file is missing (a folder that
    another worker sharing the cache is replacing at this instant): a digest of nothing
    would name no version at all.
    """
    digest = hashlib.sha256()
    read: list[str] = []
    for name in (ADAPTER_CONFIG, *ADAPTER_WEIGHTS):
        member = path / name
        if not member.is_file():
            continue
        digest.update(f"{name}\0{member.stat().st_size}\0".encode())
        with member.open("rb") as handle:
            while chunk := handle.read(_CHUNK_BYTES):
                digest.update(chunk)
        read.append(name)
    if ADAPTER_CONFIG not in read or len(read) < 2:
        missing = ADAPTER_CONFIG if ADAPTER_CONFIG not in read else " or ".join(ADAPTER_WEIGHTS)
        raise FileNotFoundError(errno.ENOENT, f"no {missing} in the adapter folder", str(path))
    return DIGEST_PREFIX + digest.hexdigest()
