"""Errors of the LoRA manager: what went wrong resolving an adapter URI, and what to do.

Every error names the URI (secrets removed) and a hint, and maps onto a
``proto.errors`` class so that its wire ``code`` says who must act::

    LorafleetError (proto)
    ├── LoraSourceError               about one URI; .uri (redacted), .reason, .hint
    │   ├── LoraInvalidUriError       + InvalidRequestError  malformed, unknown, disallowed
    │   ├── LoraInvalidAdapterError   + InvalidRequestError  not a usable adapter
    │   │   └── LoraTooLargeError                            over DYN_LORA_MAX_BYTES
    │   ├── LoraNotFoundError         + NotFoundError        nothing at that URI
    │   └── LoraUnavailableError      + UnavailableError     unreachable, credentials, crash
    └── LoraConfigError               + InvalidRequestError, ValueError  bad DYN_LORA_*

When several sources serve one scheme and all fail, the error raised is one of
the classes above (the most retryable kind among the failures) and keeps every
failure in ``failures``.
"""

from __future__ import annotations

import errno

from lorafleet.proto.errors import (
    InvalidRequestError,
    LorafleetError,
    NotFoundError,
    UnavailableError,
)
from lorafleet.proto.limits import shorten
from lorafleet.worker.lora._redact import redact_uri

__all__ = [
    "LoraConfigError",
    "LoraInvalidAdapterError",
    "LoraInvalidUriError",
    "LoraNotFoundError",
    "LoraSourceError",
    "LoraTooLargeError",
    "LoraUnavailableError",
    "adapter_too_big",
    "is_local_disk_error",
]


class LoraSourceError(LorafleetError):
    """An adapter URI could not be resolved to a local directory.

    ``uri`` is stored without secrets, cut to ``MAX_SHOWN_CHARS``; ``failures`` holds
    the per-source errors when several sources were tried. ``reason`` travels as a field
    of its own, so a frontend can tell a client why without the URI or the operator's hint.
    """

    def __init__(
        self,
        uri: str,
        reason: str,
        *,
        hint: str = "",
        failures: tuple[LoraSourceError, ...] = (),
    ) -> None:
        self.uri = shorten(redact_uri(uri))
        self.reason = reason
        self.hint = hint
        self.failures = failures
        message = f"LoRA source {self.uri}: {reason}"
        super().__init__(f"{message}; {hint}" if hint else message, uri=self.uri, reason=reason)


class LoraInvalidUriError(LoraSourceError, InvalidRequestError):
    """The URI is malformed, its scheme has no source, or the scheme is not allowed."""


class LoraInvalidAdapterError(LoraSourceError, InvalidRequestError):
    """The files at the URI are not a PEFT adapter (or would escape their directory)."""


class LoraTooLargeError(LoraInvalidAdapterError):
    """The adapter (listed, declared by an archive, or written so far) is over
    ``DYN_LORA_MAX_BYTES``. Loading it again from the same source cannot help, so placement
    does not retry it until its declared source changes."""


class LoraNotFoundError(LoraSourceError, NotFoundError):
    """Nothing exists at the URI: missing path, bucket or prefix."""


class LoraUnavailableError(LoraSourceError, UnavailableError):
    """The source cannot be reached or refused the credentials; retrying may help."""


class LoraConfigError(InvalidRequestError, ValueError):
    """A ``DYN_LORA_*`` setting or a source registration is invalid; names the setting.

    A ``ValueError`` too, as every bad setting is: the worker's command line then stops with
    one usage line naming the variable (``process.settings_cli.parse_settings``)."""


LOCAL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
"""Errors of the disk a download writes to (full, over quota, read-only), never of a source."""


def is_local_disk_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the local disk's fault: the manager then names the cache's disk
    instead of blaming the source (a full cache read as "the S3 download failed")."""
    return isinstance(exc, OSError) and exc.errno in LOCAL_DISK_ERRNOS


def adapter_too_big(uri: str, size: int, bound: int) -> LoraTooLargeError:
    """The error for an adapter of ``size`` bytes (listed or written so far) over ``bound``."""
    return LoraTooLargeError(
        uri,
        f"the adapter is larger than DYN_LORA_MAX_BYTES ({size} > {bound} bytes)",
        hint="raise DYN_LORA_MAX_BYTES on the workers if this adapter is expected",
    )
