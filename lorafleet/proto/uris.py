"""Adapter URIs as strings: split off the scheme, and remove secrets before showing one.

``split_uri`` is the one parser of ``scheme://rest`` (validation in ``proto``,
the worker's sources and its LoRA controller all use it). Everything that puts
a URI into a log line, an error message or an HTTP answer goes through
``redact_uri`` (workers and the frontend alike); answers to callers who showed
no token also hide paths on a worker's disk (``public_uri``, ``public_uris_in``).
Pure string work, no I/O.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = [
    "is_scheme_name",
    "public_uri",
    "public_uris_in",
    "redact_uri",
    "redact_uris_in",
    "split_uri",
]

REDACTED: Final = "***"
_SCHEME: Final = re.compile(r"[a-z][a-z0-9+.-]*")
_URI_IN_TEXT: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")
_PATH_IN_TEXT: Final = re.compile(r"(?<![\w.:/~*-])~?(?:/[\w.@+=-]+){2,}/?")
"""An absolute (or ``~/``) path of two segments or more standing alone in a message."""


def is_scheme_name(scheme: str) -> bool:
    """Return whether ``scheme`` is a lower-case RFC 3986 scheme name (``s3``, ``hf+git``)."""
    return _SCHEME.fullmatch(scheme) is not None


def split_uri(uri: str) -> tuple[str, str] | None:
    """``(scheme, rest)`` of ``scheme://rest`` with the scheme lower-cased.

    None when ``uri`` has no valid scheme name or nothing after ``://``.
    """
    scheme, sep, rest = uri.partition("://")
    scheme = scheme.lower()
    if not sep or not rest or not is_scheme_name(scheme):
        return None
    return scheme, rest


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
    parts = split_uri(redacted)
    if parts is not None and parts[0] != "file":
        return redacted
    if parts is None and not redacted.startswith(("/", "~", ".")):
        return redacted  # a hub id such as ``org/model``, or a bare name
    path = redacted if parts is None else parts[1]
    name = path.rstrip("/").rpartition("/")[2]
    return f"file:///{REDACTED}/{name}" if name else f"file:///{REDACTED}"


def public_uris_in(text: str) -> str:
    """``text`` (an error message) with every URI and path in it as ``public_uri`` shows it.

    A bare path keeps only its last segment (``/srv/ad/bigrank`` is ``***/bigrank``):
    engines and file checks name the folder they read.
    """
    shown = _URI_IN_TEXT.sub(lambda match: public_uri(match.group()), text)
    return _PATH_IN_TEXT.sub(_public_path, shown)


def _public_path(match: re.Match[str]) -> str:
    name = match.group().rstrip("/").rpartition("/")[2]
    return f"{REDACTED}/{name}"


def redact_uris_in(text: str) -> str:
    """``text`` (an error message) with every URI in it redacted (``redact_uri``)."""
    return _URI_IN_TEXT.sub(lambda match: redact_uri(match.group()), text)


def _redact_pair(pair: str) -> str:
    name, sep, _ = pair.partition("=")
    return f"{name}={REDACTED}" if sep else name
