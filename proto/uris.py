"""Remove secrets (user info, query values such as presigned signatures) from a URI.

Everything that puts a URI into a log line, an error message or an HTTP answer goes
through here (workers and the frontend alike). Pure string work, no I/O.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = ["redact_uri"]

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


def _redact_pair(pair: str) -> str:
    name, sep, _ = pair.partition("=")
    return f"{name}={REDACTED}" if sep else name
