"""Request ids and the access log: one ASGI middleware around every HTTP request.

The middleware runs inside Litestar; ``frontend.generate_door`` calls :func:`logged` itself
for the generate routes it answers before Litestar, so both write the same line.

It takes the client's ``x-request-id`` (bounded and sanitised) or makes one, binds it
to structlog's context so every log line about the request carries it, echoes it on
the response, and writes one ``access`` line at info level when the request ends.
Handlers add what only they know (model, token counts) to :func:`current_record`.
"""

from __future__ import annotations

import contextvars
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, HTTPScope, Message, Receive, Scope, Send

__all__ = [
    "AccessLogMiddleware",
    "MAX_REQUEST_ID_CHARS",
    "REQUEST_ID_HEADER",
    "RequestRecord",
    "Serve",
    "current_record",
    "logged",
    "new_request_id",
    "request_id_from",
]

log = structlog.get_logger("frontend.access")

REQUEST_ID_HEADER: Final = "x-request-id"
REQUEST_ID_HEADER_BYTES: Final = REQUEST_ID_HEADER.encode()
SESSION_ID_HEADER_BYTES: Final = b"x-session-id"
"""Keeps a conversation on one version of an alias (``frontend.aliases``)."""
MAX_REQUEST_ID_CHARS: Final = 128
"""Longest request id kept from a client; longer ones are cut (ids end up in logs and
on NATS, so they stay short)."""
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._:@/+=-]")

Serve: TypeAlias = Callable[[Send], Awaitable[None]]
"""Answers one request through the ``send`` it is given (which echoes the request id)."""


@dataclass
class RequestRecord:
    """What the access line reports beyond the HTTP layer; handlers fill it in."""

    request_id: str
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    session: str = ""
    tenant: str = ""
    """The caller's tenant when API keys are in use (the key itself is never logged)."""
    first_token_s: float | None = None
    """The client's ``x-session-id`` header (cut to ``MAX_REQUEST_ID_CHARS``), if any."""
    status: int | None = None
    """The status to log instead of the one sent: 499 for a stream whose client hung up
    after its 200 head."""


_record: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "lorafleet_request_record", default=None
)


def current_record() -> RequestRecord:
    """The record of the request being served (a throwaway one outside any request)."""
    return _record.get() or RequestRecord(request_id=new_request_id())


def new_request_id() -> str:
    """A fresh request id: 32 random hex digits (a third of ``uuid4().hex``'s CPU)."""
    return os.urandom(16).hex()


def request_id_from(value: str | None) -> str:
    """The client's id with unsafe characters dropped and cut to length, or a new one."""
    if not value:  # most requests: no regex to run
        return new_request_id()
    cleaned = _UNSAFE.sub("", value)[:MAX_REQUEST_ID_CHARS]
    return cleaned or new_request_id()


class AccessLogMiddleware:
    """Give every HTTP request an id, log lines with it, and one access line at its end."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        await logged(scope, send, lambda send_with_id: self.app(scope, receive, send_with_id))


async def logged(scope: HTTPScope, send: Send, serve: Serve, started: float | None = None) -> None:
    """Run ``serve`` as the request of ``scope``: with its id bound to the log context and
    echoed on the response, and its access line written when it ends. ``started``
    (``perf_counter``; now) is when the request arrived."""
    request_id, session = _id_headers(scope)
    record = RequestRecord(request_id=request_id_from(request_id))
    record.session = (session or "")[:MAX_REQUEST_ID_CHARS]
    status = 500
    echoed = (REQUEST_ID_HEADER_BYTES, record.request_id.encode())

    async def send_with_id(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            message["headers"] = [*message.get("headers", []), echoed]
        await send(message)

    token = _record.set(record)
    bound = structlog.contextvars.bind_contextvars(request_id=record.request_id)
    started = time.perf_counter() if started is None else started
    try:
        await serve(send_with_id)
    finally:
        _log_access(scope, record, record.status or status, time.perf_counter() - started)
        structlog.contextvars.reset_contextvars(**bound)
        _record.reset(token)


def _id_headers(scope: HTTPScope) -> tuple[str | None, str | None]:
    """The last ``x-request-id`` and ``x-session-id`` headers' values, if any: one dict of
    the headers, built in C, where a loop over them cost 70 bytecodes per request."""
    headers = dict(scope["headers"])
    request_id = headers.get(REQUEST_ID_HEADER_BYTES)
    session = headers.get(SESSION_ID_HEADER_BYTES)
    return (
        None if request_id is None else request_id.decode("latin-1"),
        None if session is None else session.decode("latin-1"),
    )


def _log_access(scope: HTTPScope, record: RequestRecord, status: int, duration_s: float) -> None:
    log.info(
        "access", method=scope["method"], route=scope["path"], model=record.model,
        status=status, duration_s=round(duration_s, 4), prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens, tenant=record.tenant,
    )  # fmt: skip
