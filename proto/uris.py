"""Remove secrets (user info, query values such as presigned signatures) from a URI.

Everything that puts a URI into a log line, an error message or an HTTP answer goes
through here (workers and the frontend alike); answers to callers who showed no
token also hide paths on a worker's disk (``public_uri``). Pure string work, no I/O.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = ["public_uri", "redact_uri"]

REDACTED: Final = "***"


def redact_uri(uri: str) -> str:
    """Return ``uri`` with its user info and every query value replaced by ``***``."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparseable uri>"
    netloc = parts.netloc
    if "@" not in netloc and not parts.query and not parts.fragment:
        return uri
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = "&".join(_redact_pair(pair) for pair in parts.query.split("&")) if parts.query else ""
    return urlunsplit(SplitResult(parts.scheme, netloc, parts.path, query, ""))


def public_uri(source: str) -> str:
    """``source`` (a URI, a path or a hub id) as a caller without a token may see it.

    Secrets are redacted; a ``file://`` URI or an absolute path keeps only its last
    segment (``file:///***/pirate``): the layout of a worker's disk is nobody's business.
    """
    redacted = redact_uri(source)
    scheme, sep, rest = redacted.partition("://")
    if sep and scheme.lower() != "file":
        return redacted
    if not sep and not redacted.startswith(("/", "~", ".")):
        return redacted  # a hub id such as ``org/model``, or a bare name
    path = rest if sep else redacted
    name = path.rstrip("/").rpartition("/")[2]
    return f"file:///{REDACTED}/{name}" if name else f"file:///{REDACTED}"


def _redact_pair(pair: str) -> str:
    name, sep, _ = pair.partition("=")
    return f"{name}={REDACTED}" if sep else name
