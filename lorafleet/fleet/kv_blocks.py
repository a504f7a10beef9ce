"""Prefix-cache blocks as the whole fleet names them: one chain of hashes per model version.

Workers hash the blocks their engines cache with these functions and frontends hash
requests with the same ones, so one number means one cached prefix everywhere: a block's
hash covers its tokens and every block before it, the model version (an adapter's digest)
and the request's cache salt. A block computed under one adapter, one version of it, or
one tenant's salt never matches another's (``docs/routing.md``). Pure: no I/O.
"""

from __future__ import annotations

import functools
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from blake3 import blake3

__all__ = [
    "BlockChain",
    "HASH_BYTES",
    "block_hashes",
    "chain_seed",
    "iter_words_tokens",
    "version_key",
    "words_count",
    "words_tokens",
]

HASH_BYTES: Final = 8
"""Bytes of blake3 kept per block: 64-bit hashes, collision-free at any fleet's size."""
TOKEN_BYTES: Final = 8
"""Bytes a token id is hashed as (a signed 64-bit integer, little-endian)."""
_SPACES: Final = b" \t\n\r\x0b\x0c"
"""The bytes ``bytes.split()`` splits on, so the words ``words_tokens`` makes."""
_WORD_MARKS: Final = bytes(ord(" ") if byte in _SPACES else ord("x") for byte in range(256))
"""A ``bytes.translate`` table: a space byte to ``b" "``, any other to ``b"x"`` (a word
starts at each ``b" x"``)."""


def version_key(model: str, digest: str = "") -> str:
    """The version a block belongs to: ``name@digest`` for an adapter version, the base
    model's name for the base model (an empty digest)."""
    return f"{model}@{digest}" if digest else model


@functools.lru_cache(maxsize=4096)
def chain_seed(version: str, salt: str = "") -> bytes:
    """The value a chain starts from: its version and cache salt (vLLM's ``cache_salt``),
    so that neither shares a block with another. Kept for the versions and salts seen
    last: every prompt of one version starts from the same seed."""
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


class BlockChain:
    """The hashes of a prompt's whole blocks (as ``block_hashes`` makes them), made as a
    reader iterates: the first block alone, then every block left at once. A router that
    stops at the first block no instance holds hashes (and, with lazy ``token_chunks``,
    tokenizes) one block of a long prompt, not all of it; a prompt read past its first
    block is nearly always read deep, and hashing the rest in one go is the faster way.
    Iterate it as often as needed; each block is hashed once.

    ``token_chunks``: the prompt's tokens in order, in lists of any length (the whole
    prompt as one list, or ``iter_words_tokens``' chunks)."""

    def __init__(
        self, token_chunks: Iterable[Sequence[int]], block_size: int, version: str,
        salt: str = "",
    ) -> None:  # fmt: skip
        self._chunks = iter(token_chunks)
        self._block_size = block_size
        self._version = version
        self._salt = salt
        self._unhashed: list[int] = []
        """Tokens read from the chunks and not hashed yet."""
        self._hashes: list[int] = []
        self._ended = False

    def __iter__(self) -> Iterator[int]:
        return iter(self._hashes) if self._ended else self._read()

    def _read(self) -> Iterator[int]:
        depth = 0
        while depth < len(self._hashes) or self._extend():
            if self._ended:  # every block is hashed: the rest without a step per block
                yield from self._hashes[depth:]
                return
            yield self._hashes[depth]
            depth += 1

    def first(self) -> int | None:
        """The first block's hash; None for a prompt shorter than a block."""
        if self._hashes:  # asked of every prompt several times: no iterator once hashed
            return self._hashes[0]
        return next(iter(self), None)

    def _extend(self) -> bool:
        """Hash the first block, or else every block left; False when there was none."""
        if self._ended:
            return False
        first_only = not self._hashes
        for chunk in self._chunks:
            self._unhashed.extend(chunk)
            if first_only and len(self._unhashed) >= self._block_size:
                break
        whole = len(self._unhashed) // self._block_size * self._block_size
        if first_only:
            whole = min(whole, self._block_size)
        last = self._hashes[-1] if self._hashes else None
        start = last.to_bytes(HASH_BYTES, "little", signed=True) if last is not None else b""
        hashes = block_hashes(self._unhashed[:whole], self._block_size, self._version,
                              self._salt, start=start)  # fmt: skip
        del self._unhashed[:whole]
        self._hashes.extend(hashes)
        self._ended = not first_only or not hashes
        return bool(hashes)


def words_tokens(texts: Iterable[str]) -> list[int]:
    """The mocker's tokenizer: one token per whitespace-separated word of ``texts`` (a
    prompt, or each chat message's content in order), its id the word's CRC-32.

    Frontends use it for instances whose ``KvCacheSpec.tokenizer`` is ``words``.
    """
    return [zlib.crc32(word) for text in texts for word in text.encode().split()]


def words_count(texts: Iterable[str]) -> int:
    """How many tokens ``words_tokens`` makes of ``texts``, without making them: the word
    starts counted in one pass over each text (a split makes an object per word)."""
    return sum((b" " + text.encode().translate(_WORD_MARKS)).count(b" x") for text in texts)


def iter_words_tokens(texts: Iterable[str], first_words: int = 64) -> Iterator[list[int]]:
    """``words_tokens`` in lists: the first ``first_words`` words, then the rest of each
    text. A reader that stops after the first block splits little more than its words."""
    budget = first_words
    for text in texts:
        data = text.encode()
        if budget > 0:
            words = data.split(None, budget)
            data = words.pop() if len(words) > budget else b""
            budget -= len(words)
            yield [zlib.crc32(word) for word in words]
        if data:
            yield [zlib.crc32(word) for word in data.split()]
