"""Pure helpers on adapter URIs: the scheme, and the cache key derived from the URI."""

from __future__ import annotations

import re
from typing import Final

import blake3

from worker.lora.errors import LoraInvalidUriError

__all__ = ["CACHE_KEY_HEX_CHARS", "cache_key", "check_scheme_name", "uri_scheme"]

CACHE_KEY_HEX_CHARS: Final = 32
_SCHEME: Final = re.compile(r"[a-z][a-z0-9+.-]*")


def check_scheme_name(scheme: str) -> bool:
    """Return whether ``scheme`` is a lower-case RFC 3986 scheme name (``s3``, ``hf+git``)."""
    return _SCHEME.fullmatch(scheme) is not None


def uri_scheme(uri: str) -> str:
    """Return the lower-cased scheme of ``uri``; raise if there is none."""
    scheme, sep, rest = uri.partition("://")
    scheme = scheme.lower()
    if not sep or not rest or not check_scheme_name(scheme):
        raise LoraInvalidUriError(
            uri,
            "not a URI with a scheme",
            hint="write it as scheme://location, e.g. s3://bucket/prefix",
        )
    return scheme


def cache_key(uri: str) -> str:
    """Return the cache directory name of ``uri``: ``{scheme}_{first 32 hex of blake3(uri)}``."""
    digest = blake3.blake3(uri.encode()).hexdigest()[:CACHE_KEY_HEX_CHARS]
    return f"{uri_scheme(uri)}_{digest}"
