"""Errors of the frontend, and the one table that maps error codes to HTTP statuses.

Hierarchy::

    proto.errors.InvalidRequestError
    ├── BadFieldError            a request field is wrong (param names it)       400
    ├── InvalidBodyError         the body is not JSON or not the request type    400
    ├── BodyTooLargeError        the body is bigger than the frontend reads      413
    └── PayloadTooLargeError     the request is bigger than NATS carries         413
    proto.errors.NotFoundError
    └── ModelNotFoundError       no live instance serves that name               404
    proto.errors.CapacityError
    ├── LoadQueueFullError       too many requests wait for one adapter's load    429
    └── FleetSaturatedError      the fleet is saturated; lower priorities shed    429
    proto.errors.UnavailableError
    ├── NoLiveInstanceError      the model is known but no instance answered     503
    ├── InstanceLostError        one instance stopped answering (retried)        503
    ├── BaseModelUnavailableError  a cold adapter's base model has no instance   503
    └── LoadTimeoutError         an on-demand adapter load took too long         503
    proto.errors.UpstreamError
    ├── WorkerError              a worker answered with an error                 502
    └── LoadUnauthorizedError    a worker refused this frontend's token          502
    proto.errors.LorafleetError
    ├── AdapterLoadFailedError   the adapter's load failed (recently)            424
    ├── AdapterUnplaceableError  no live instance can take the adapter           424
    ├── BodyTimeoutError         the body did not arrive within its timeout      408
    └── ClientGoneError          the client hung up before its answer's end      499

The code -> HTTP status table is ``proto.errors.HTTP_STATUS_BY_CODE``, shared with workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import ClassVar, Final

import msgspec
import structlog

from lorafleet.proto.adapters import AdapterLoadError
from lorafleet.proto.errors import (
    HTTP_STATUS_BY_CODE,
    CapacityError,
    InvalidRequestError,
    LorafleetError,
    NotFoundError,
    UnavailableError,
    UpstreamError,
    http_status,
)
from lorafleet.proto.limits import shorten
from lorafleet.proto.openai import OpenAIError, OpenAIErrorResponse
from lorafleet.proto.uris import public_uris_in

__all__ = [
    "AdapterLoadFailedError",
    "AdapterUnplaceableError",
    "BadFieldError",
    "BaseModelUnavailableError",
    "BodyTimeoutError",
    "BodyTooLargeError",
    "ClientGoneError",
    "FleetSaturatedError",
    "HTTP_STATUS_BY_CODE",
    "InstanceLostError",
    "InvalidBodyError",
    "LoadQueueFullError",
    "LoadTimeoutError",
    "LoadUnauthorizedError",
    "ModelNotFoundError",
    "NoLiveInstanceError",
    "OPENAI_TYPE_BY_STATUS",
    "PayloadTooLargeError",
    "RETRYABLE_WORKER_CODES",
    "RETRY_AFTER_S",
    "WorkerError",
    "framing_error_body",
    "http_status",
    "names_in_message",
    "openai_error",
    "openai_type",
    "unexpected_error",
]

log = structlog.get_logger(__name__)


OPENAI_TYPE_BY_STATUS: Final[Mapping[int, str]] = MappingProxyType(
    {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "invalid_request_error",
        405: "invalid_request_error",
        408: "invalid_request_error",
        409: "invalid_request_error",
        413: "invalid_request_error",
        415: "invalid_request_error",
        429: "rate_limit_error",
    }
)
"""OpenAI's error ``type`` by status; anything else is a ``server_error``."""

MAX_NAMES_IN_MESSAGE: Final = 20


def names_in_message(names: Sequence[str], total: int | None = None) -> str:
    """``a, b and 3 more`` for an error message: the first ``MAX_NAMES_IN_MESSAGE`` names, and
    how many more of ``total`` (default: all of ``names``); ``none`` when there are none."""
    count = len(names) if total is None else total
    shown = ", ".join(names[:MAX_NAMES_IN_MESSAGE]) or "none"
    more = f" and {count - MAX_NAMES_IN_MESSAGE} more" if count > MAX_NAMES_IN_MESSAGE else ""
    return shown + more


RETRYABLE_WORKER_CODES: Final = frozenset({"unavailable", "not_found", "capacity"})
"""Worker errors that another instance may not have (shutting down, adapter gone, full)."""


RETRY_AFTER_S: Final = 1
"""``Retry-After`` of every 429 (a slot, a load queue or a quota may free up soon), as the
worker's own 429 says."""


def openai_type(status: int) -> str:
    """Return OpenAI's error ``type`` for an HTTP status."""
    return OPENAI_TYPE_BY_STATUS.get(status, "server_error")


def openai_error(exc: LorafleetError) -> tuple[int, OpenAIErrorResponse]:
    """The HTTP status and OpenAI error body for one of our errors."""
    status, code = http_status(exc.code), exc.code
    if isinstance(exc, WorkerError):
        status = exc.status
        code = exc.error.code if status < 500 else exc.code
    error = OpenAIError(
        message=exc.message,
        type=openai_type(status),
        param=getattr(exc, "param", None),
        code=code,
    )
    return status, OpenAIErrorResponse(error=error)


def unexpected_error(exc: Exception, path: str) -> tuple[int, OpenAIErrorResponse]:
    """Log an exception nobody expected (with its traceback) and give its 500 answer."""
    log.exception("unexpected error", path=path)
    error = OpenAIError(
        message=f"Internal error: {type(exc).__name__}: {public_uris_in(str(exc))}",
        type="server_error",
        code="internal_error",
    )
    return 500, OpenAIErrorResponse(error=error)


def framing_error_body(reason: str) -> bytes:
    """The JSON of the 400 that uvicorn answers itself to a request it cannot parse (bad
    framing, a bad request line): OpenAI's error shape, not uvicorn's plain text."""
    error = OpenAIError(
        message=f"Invalid HTTP request: {reason} Send one well-formed HTTP/1.1 request.",
        type="invalid_request_error",
        code="invalid_request",
    )
    return msgspec.json.encode(OpenAIErrorResponse(error=error))


class BadFieldError(InvalidRequestError):
    """A request field is missing or wrong; ``param`` names it."""

    def __init__(self, param: str, problem: str) -> None:
        self.param = param
        super().__init__(f"Invalid request: {param}: {problem}")


class PayloadTooLargeError(InvalidRequestError):
    """A request would not fit in one NATS message (the server's ``max_payload``)."""

    code: ClassVar[str] = "payload_too_large"

    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes
        super().__init__(
            f"Request too large: it takes {size_bytes} bytes for a worker and NATS carries at "
            f"most {limit_bytes} bytes in one message (the NATS server's max_payload); "
            "shorten the prompt or messages"
        )


class InvalidBodyError(InvalidRequestError):
    """The body is not JSON, or not the route's request type; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        self.param = param
        super().__init__(message)


class BodyTooLargeError(InvalidRequestError):
    """The body is larger than the frontend reads (``MAX_BODY_BYTES``)."""

    code: ClassVar[str] = "payload_too_large"

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        super().__init__(f"Request body too large: the frontend reads at most {limit_bytes} bytes")


class BodyTimeoutError(LorafleetError):
    """The body did not arrive within the body timeout after the request's headers."""

    code: ClassVar[str] = "request_timeout"

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        super().__init__(
            f"Request body not received within {timeout_s:g} s of its headers (the frontend's "
            "--body-timeout-s, DYN_BODY_TIMEOUT_S); send the whole body at once"
        )


class ClientGoneError(LorafleetError):
    """The client hung up before its answer's end: counted and logged as 499, never sent."""

    code: ClassVar[str] = "client_gone"

    def __init__(self, request_id: str, when: str) -> None:
        self.request_id = request_id
        super().__init__(f"Client closed the connection {when} (request {request_id!r})")


class ModelNotFoundError(NotFoundError):
    """Nobody serves ``model``; the message lists what is available."""

    param = "model"

    def __init__(self, model: str, available: Iterable[str], total: int | None = None) -> None:
        """``available``: names that exist (the first ``MAX_NAMES_IN_MESSAGE`` in order are
        shown); ``total``: how many exist, when ``available`` holds only the first ones."""
        self.model = model
        super().__init__(
            f"The model {shorten(model)!r} does not exist or no live instance serves it; "
            f"available models: {names_in_message(sorted(available), total)}"
        )


class NoLiveInstanceError(UnavailableError):
    """The model is known but no instance of it could be reached."""

    param = "model"

    def __init__(self, model: str, tried: Iterable[int] = (), why: str = "") -> None:
        self.model = model
        self.tried = list(tried)
        ids = ", ".join(f"{instance:x}" for instance in self.tried)
        detail = f"; instances tried: {ids}" if ids else ""
        because = f"; last: {why}" if why else ""
        super().__init__(f"No live instance serves model {model!r} right now{detail}{because}")


class InstanceLostError(UnavailableError):
    """An instance has no responder or stopped answering; another may be tried."""

    def __init__(
        self,
        instance_id: int,
        reason: str,
        *,
        stalled: bool = False,
        link_dropped: bool = False,
        no_responders: bool = False,
    ) -> None:
        self.instance_id = instance_id
        self.reason = reason
        self.stalled = stalled
        self.link_dropped = link_dropped
        """This frontend's own NATS link dropped: the instance itself may be fine."""
        self.no_responders = no_responders
        """Nobody subscribes its subject: it exited, or its NATS node died a moment ago."""
        super().__init__(f"Worker instance {instance_id:x} is not answering: {reason}")


class BaseModelUnavailableError(UnavailableError):
    """A desired adapter is cold and no live instance serves its base model to load it on."""

    param = "model"

    def __init__(self, adapter: str, base_model: str) -> None:
        self.adapter = adapter
        self.base_model = base_model
        super().__init__(
            f"Adapter {adapter!r} is not loaded anywhere and no live instance of its base model "
            f"{base_model!r} could load it"
        )


class LoadTimeoutError(UnavailableError):
    """An on-demand load did not finish (loaded and visible in etcd) in time."""

    param = "model"

    def __init__(self, adapter: str, timeout_s: float) -> None:
        self.adapter = adapter
        self.timeout_s = timeout_s
        super().__init__(
            f"Adapter {adapter!r} was not loaded within {timeout_s:g} s (on-demand timeout); "
            "retry later"
        )


class WorkerError(UpstreamError):
    """A worker answered a request with an error; the message is the worker's."""

    def __init__(self, instance_id: int, error: LorafleetError) -> None:
        self.instance_id = instance_id
        self.error = error
        # Callers need no token: paths on the worker's disk stay there (``public_uris_in``).
        shown = public_uris_in(error.message)
        super().__init__(f"Worker instance {instance_id:x} failed: {shown}")

    @property
    def retryable(self) -> bool:
        """Whether another instance may not have this error (shutting down, adapter gone, full)."""
        return self.error.code in RETRYABLE_WORKER_CODES

    @property
    def status(self) -> int:
        """502, or the worker error's own status when the caller is at fault (4xx)."""
        own = http_status(self.error.code)
        return own if 400 <= own < 500 else 502


class LoadUnauthorizedError(UpstreamError):
    """A worker refused an on-demand load for want of its token: the operator's fault, not
    the client's, hence 502 and not 401."""

    param = "model"

    def __init__(self, adapter: str, instance_id: int) -> None:
        self.adapter = adapter
        self.instance_id = instance_id
        super().__init__(
            f"Adapter {adapter!r} could not be loaded: worker instance {instance_id:x} refused "
            "this frontend's token; set the frontend's DYN_SYSTEM_AUTH_TOKEN to the workers'"
        )


class AdapterLoadFailedError(LorafleetError):
    """A desired adapter is loaded nowhere because its last load failed; says where, when,
    why (the worker's code and message) and what to do. 424: retrying at once cannot help."""

    code: ClassVar[str] = "adapter_load_failed"
    param = "model"

    def __init__(self, adapter: str, error: AdapterLoadError, retry_after: str) -> None:
        self.adapter = adapter
        self.failure = error
        super().__init__(
            f"Adapter {adapter!r} failed to load: worker instance {error.instance} answered "
            f"{error.code}: {error.message} (at {error.at}); fix its source and apply it "
            f"again (lorafleet lora apply), or retry after {retry_after}"
        )


class AdapterUnplaceableError(LorafleetError):
    """A desired adapter that no live instance of its base model can take (its rank exceeds
    their ``--max-lora-rank``): no load is tried. 424: retrying at once cannot help."""

    code: ClassVar[str] = "adapter_unplaceable"
    param = "model"

    def __init__(self, adapter: str, reason: str) -> None:
        self.adapter = adapter
        self.reason = reason
        super().__init__(f"Adapter {adapter!r} cannot be loaded on any live instance: {reason}")


class LoadQueueFullError(CapacityError):
    """Too many requests already wait for one adapter's load: 429, retry later."""

    param = "model"

    def __init__(self, adapter: str, waiting: int) -> None:
        self.adapter = adapter
        self.waiting = waiting
        super().__init__(
            f"Adapter {adapter!r} is being loaded and {waiting} requests already wait for it "
            "(the frontend's --on-demand-queue, DYN_ON_DEMAND_QUEUE); retry later"
        )


class FleetSaturatedError(CapacityError):
    """The fleet is saturated and this request was shed before higher priorities: 429."""

    def __init__(
        self, tenant: str, priority: int, capacity: int, fleet_max_inflight: int, why: str
    ) -> None:
        self.tenant = tenant
        self.priority = priority
        whose = f"tenant {tenant!r}" if tenant else "a request without a tenant"
        super().__init__(
            f"The fleet is saturated: this frontend runs its share of --fleet-max-inflight="
            f"{fleet_max_inflight} ({capacity} requests at once) and {whose}, priority "
            f"{priority}, was shed because {why}; lower priorities are shed first; retry later",
            tenant=tenant, priority=priority,
        )  # fmt: skip
