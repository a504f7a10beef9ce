"""Prefix-cache blocks as the whole fleet names them: one chain of hashes per model version.

Workers hash the blocks their engines cache with these functions and frontends hash
requests with the same ones, so one number means one cached prefix everywhere: a block's
hash covers its tokens and every block before it, the model version (an adapter's digest)
and the request's cache salt. A block computed under one adapter, one version of it, or
one tenant's salt never matches another's (``docs/routing.md``). Pure: no I/O.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Sequence
from typing import Final

from blake3 import blake3

__all__ = [
    "HASH_BYTES",
    "block_hashes",
    "chain_seed",
    "version_key",
    "words_tokens",
]

HASH_BYTES: Final = 8
"""Bytes of blake3 kept per block: 64-bit hashes, collision-free at any fleet's size."""
TOKEN_BYTES: Final = 8
"""Bytes a token id is hashed as (a signed 64-bit integer, little-endian)."""


def version_key(model: str, digest: str = "") -> str:
    """The version a block belongs to: ``name@digest`` for an adapter version, the base
    model's name for the base model (an empty digest)."""
    return f"{model}@{digest}" if digest else model


def chain_seed(version: str, salt: str = "") -> bytes:
    """The value a chain starts from: its version and cache salt (vLLM's ``cache_salt``),
    so that neither shares a block with another."""
    return blake3(f"{version}\0{salt}".encode()).digest(HASH_BYTES)


def block_hashes(
    tokens: Sequence[int], block_size: int, version: str, salt: str = "", *, start: bytes = b""
) -> list[int]:
    """The hash of every whole block of ``tokens``, in order (a tail shorter than a block
    has none). ``start``: the seed to continue from (``chain_seed`` by default).

    Token ids are hashed as 64-bit integers; ``bytes`` (a prompt's text, the frontend's
    character blocks) as they are, ``block_size`` bytes a block."""
    previous = start or chain_seed(version, salt)
    if isinstance(tokens, bytes):
        data, width = tokens, block_size
    else:
        data, width = array("q", tokens).tobytes(), block_size * TOKEN_BYTES
    hashes: list[int] = []
    for begin in range(0, len(data) - width + 1, width):
        previous = blake3(previous + data[begin : begin + width]).digest(HASH_BYTES)
        hashes.append(int.from_bytes(previous, "little", signed=True))
    return hashes


def words_tokens(texts: Iterable[str]) -> list[int]:
    """The mocker's tokenizer: one token per whitespace-separated word of ``texts`` (a
    prompt, or each chat message's content in order), its id the word's CRC-32.

    Frontends use it for instances whose ``KvCacheSpec.tokenizer`` is ``words``.
    """
    return [zlib.crc32(word) for text in texts for word in text.encode().split()]
