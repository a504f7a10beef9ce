"""The root of every lorafleet error and the wire shape of an error reply.

Hierarchy (each package adds its own in its own ``errors.py``)::

    LorafleetError                 code "internal_error"
    ├── InvalidRequestError        code "invalid_request"   (HTTP 400)
    │   └── AdapterRankError       code "adapter_rank_too_large" (HTTP 400)
    ├── UnauthorizedError          code "unauthorized"      (HTTP 401)
    ├── NotFoundError              code "not_found"         (HTTP 404)
    ├── ConflictError              code "conflict"          (HTTP 409)
    ├── CapacityError              code "capacity"          (HTTP 429)
    ├── UnavailableError           code "unavailable"       (HTTP 503)
    │   ├── NatsUnavailableError   code "nats_unavailable"  (HTTP 503)
    │   └── ShuttingDownError      code "shutting_down"     (HTTP 503)
    └── UpstreamError              code "upstream_error"    (HTTP 502)

The ``code`` travels in :class:`ErrorInfo` across NATS and HTTP so that the
receiving side can rebuild the right error class without parsing messages.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

__all__ = [
    "AdapterRankError",
    "CapacityError",
    "ConflictError",
    "ErrorInfo",
    "ForbiddenError",
    "HTTP_STATUS_BY_CODE",
    "InvalidRequestError",
    "LorafleetError",
    "NatsUnavailableError",
    "NotFoundError",
    "RateLimitedError",
    "ShuttingDownError",
    "UnauthorizedError",
    "UnavailableError",
    "UpstreamError",
    "error_body",
    "error_code",
    "error_from_info",
    "http_status",
]


class ErrorInfo(msgspec.Struct, kw_only=True, frozen=True):
    """An error as it crosses a process boundary: a stable code and a message."""

    code: str
    message: str
    reason: str = ""
    """Why, in words any client may see (no paths, no operator hints); empty when the
    message is all there is. A LoRA source error's ``reason``, for instance."""


class LorafleetError(Exception):
    """Base of every error lorafleet raises on purpose; ``code`` is stable on the wire."""

    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        """Structured context (``lora_name=``, ``uri=``, ...) shown beside the message."""

    def to_info(self) -> ErrorInfo:
        """Return the wire form of this error (its ``reason`` field, if any, travels too)."""
        reason = self.fields.get("reason")
        return ErrorInfo(code=self.code, message=self.message, reason=str(reason or ""))


class InvalidRequestError(LorafleetError):
    """The caller sent something malformed; the message names the field."""

    code: ClassVar[str] = "invalid_request"


class AdapterRankError(InvalidRequestError):
    """An engine refused an adapter whose LoRA rank exceeds its ``--max-lora-rank``: placement
    and on-demand loads learn from this code that the instance (and any with a limit no
    higher) cannot take it (``fleet.adapter_fit``)."""

    code: ClassVar[str] = "adapter_rank_too_large"


class UnauthorizedError(LorafleetError):
    """A mutating route was called without the right bearer token."""

    code: ClassVar[str] = "unauthorized"


class NotFoundError(LorafleetError):
    """The named model, adapter or route does not exist."""

    code: ClassVar[str] = "not_found"


class ConflictError(LorafleetError):
    """The request contradicts existing state (e.g. a ``lora_id`` collision)."""

    code: ClassVar[str] = "conflict"


class CapacityError(LorafleetError):
    """No free slot: every adapter slot of the engine is taken."""

    code: ClassVar[str] = "capacity"


class RateLimitedError(LorafleetError):
    """A tenant is over one of its limits; ``retry_after_s`` says when to try again."""

    code: ClassVar[str] = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.retry_after_s = retry_after_s


class ForbiddenError(LorafleetError):
    """A known caller asked for something its tenant may not do."""

    code: ClassVar[str] = "forbidden"


class UnavailableError(LorafleetError):
    """A dependency (etcd, NATS, a live instance) cannot be reached right now."""

    code: ClassVar[str] = "unavailable"
    permanent: ClassVar[bool] = False
    """True where waiting cannot help (wrong credentials, a bad certificate): the
    start-up retry loop (``discovery.startup``) gives up at once on those."""


class ShuttingDownError(UnavailableError):
    """The process is stopping and takes no new work; send it elsewhere."""

    code: ClassVar[str] = "shutting_down"


class NatsUnavailableError(UnavailableError):
    """This process's own NATS connection is down: nothing can reach any worker until it is back.

    A code of its own, so that clients and dashboards tell "the bus is down" (every
    request fails, fast) from "no instance serves this model" (``unavailable``).
    """

    code: ClassVar[str] = "nats_unavailable"


class UpstreamError(LorafleetError):
    """A worker or engine failed while handling a request that reached it."""

    code: ClassVar[str] = "upstream_error"


_BY_CODE: dict[str, type[LorafleetError]] = {
    cls.code: cls
    for cls in (
        LorafleetError,
        InvalidRequestError,
        AdapterRankError,
        UnauthorizedError,
        NotFoundError,
        ConflictError,
        CapacityError,
        ForbiddenError,
        UnavailableError,
        NatsUnavailableError,
        UpstreamError,
        ShuttingDownError,
    )
}


HTTP_STATUS_BY_CODE: dict[str, int] = {
    "invalid_request": 400,
    "adapter_rank_too_large": 400,
    "unauthorized": 401,
    "not_found": 404,
    "conflict": 409,
    "payload_too_large": 413,  # a request bigger than NATS carries (frontend.errors)
    "shutting_down": 503,
    "capacity": 429,
    "rate_limited": 429,  # a tenant over its request, token or concurrency limit
    "forbidden": 403,
    "adapter_load_failed": 424,  # the adapter's load failed; retrying at once cannot help
    "adapter_unplaceable": 424,  # no live instance can take the adapter (its rank)
    "internal_error": 500,
    "upstream_error": 502,
    "unavailable": 503,
    "nats_unavailable": 503,
    "client_gone": 499,  # nginx's "client closed request": counted, never seen by the client
    "request_timeout": 408,  # a request body that did not arrive in time (frontend.errors)
}
"""The one table from error code to HTTP status, used by the worker and the frontend."""

_CODE_BY_HTTP_STATUS: dict[int, str] = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
}


def error_code(status: int) -> str:
    """The error code of an HTTP error a server framework answered itself (an unknown route,
    a bad method, a body too large): its own code, else ``internal_error`` for a 5xx and
    ``invalid_request`` for any other status."""
    fallback = "internal_error" if status >= 500 else "invalid_request"
    return _CODE_BY_HTTP_STATUS.get(status, fallback)


def http_status(code: str) -> int:
    """HTTP status for an error code; unknown codes are internal errors (500)."""
    return HTTP_STATUS_BY_CODE.get(code, 500)


def error_body(info: ErrorInfo, **fields: Any) -> dict[str, Any]:
    """The documented JSON body of a worker's error answer, the one place it is built:
    ``{"status": "error", "code": ..., "message": ..., **fields}``."""
    return {"status": "error", "code": info.code, "message": info.message, **fields}


def error_from_info(info: ErrorInfo) -> LorafleetError:
    """Rebuild the error class named by ``info.code`` (unknown codes give the root)."""
    return _BY_CODE.get(info.code, LorafleetError)(info.message)
