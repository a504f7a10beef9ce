"""Pure helpers on adapter URIs: the scheme, and the cache key derived from the URI."""

from __future__ import annotations

from typing import Final

import blake3

from lorafleet.proto.uris import split_uri
from lorafleet.worker.lora.errors import LoraInvalidUriError

__all__ = ["CACHE_KEY_HEX_CHARS", "cache_key", "uri_scheme"]

CACHE_KEY_HEX_CHARS: Final = 32


def uri_scheme(uri: str) -> str:
    """Return the lower-cased scheme of ``uri``; raise if there is none."""
    parts = split_uri(uri)
    if parts is None:
        raise LoraInvalidUriError(
            uri,
            "not a URI with a scheme",
            hint="write it as scheme://location, e.g. s3://bucket/prefix",
        )
    return parts[0]


def cache_key(uri: str) -> str:
    """Return the cache directory name of ``uri``: ``{scheme}_{first 32 hex of blake3(uri)}``."""
    digest = blake3.blake3(uri.encode()).hexdigest()[:CACHE_KEY_HEX_CHARS]
    return f"{uri_scheme(uri)}_{digest}"
