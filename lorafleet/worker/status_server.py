"""The worker's system status HTTP server: health, metrics and the engine routes.

``/engine/{path}`` serves the engine registry; bodies must be JSON objects
(an empty body is ``{}``) of at most ``MAX_BODY_BYTES``, nested at most
``MAX_JSON_DEPTH`` levels. Every error answers in the engine routes' shape.
Adapter routes (``/v1/loras``) are mounted by ``worker.lora_routes`` when LoRA
management is configured.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import uvicorn
from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.handlers import BaseRouteHandler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.discovery.nats_connection import NatsConnection
from lorafleet.process.auth import bearer_token_accepted
from lorafleet.process.header_timeout import DEFAULT_HEADER_TIMEOUT_S, with_header_timeout
from lorafleet.process.uvicorn_server import UvicornServer
from lorafleet.proto.errors import (
    ErrorInfo,
    InvalidRequestError,
    ShuttingDownError,
    UnauthorizedError,
    error_body,
    error_code,
    http_status,
)
from lorafleet.proto.inference import UpdateReply
from lorafleet.proto.limits import check_json_depth, shorten
from lorafleet.worker.engine_registry import EngineRegistry, UpdateBody, error_reply

__all__ = [
    "MAX_BODY_BYTES",
    "StatusServer",
    "StatusState",
    "WorkerPhase",
    "admitted_body",
    "build_status_app",
    "error_response",
    "is_mutating",
    "read_json_object",
    "reply_response",
    "retry_after",
]

MAX_BODY_BYTES: Final = 1 << 20
"""Bodies larger than this are refused with 413; adapter admin bodies are tiny."""
CLOSE_TIMEOUT_S: Final = 1
"""At shutdown, requests still running on the status server after this are cancelled."""
RETRY_AFTER_S: Final = 1
"""A 429 (no free adapter slot) asks the caller to try again after this many seconds."""
_HTTP_MESSAGES: Final = {
    405: "method not allowed",
    413: f"request body too large: the status server reads at most {MAX_BODY_BYTES} bytes",
}


class WorkerPhase(enum.Enum):
    """Where the worker stands, as ``/health`` reports it; set only by the runtime."""

    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"


@dataclass
class StatusState:
    """What the status routes read: the registry, readiness, the NATS link and the admin token."""

    registry: EngineRegistry
    instance_id: int = 0
    phase: WorkerPhase = WorkerPhase.STARTING
    auth_token: str | None = None
    nats: NatsConnection | None = None
    """The worker's request-plane connection; while it is down ``/health`` answers 503."""
    lease: LeaseKeeper | None = None
    """The worker's etcd lease; once it expired unrenewed ``/health`` answers 503."""

    async def call(self, path: str, body: UpdateBody) -> UpdateReply:
        """Call an engine route; while stopping, routes that change adapters answer 503."""
        if self.phase is WorkerPhase.STOPPING and is_mutating(path):
            exc = ShuttingDownError(
                f"worker {self.instance_id:x} is shutting down and takes no {path!r}; "
                "send it to another worker"
            )
            return error_reply(exc)
        return await self.registry.call(path, body)

    def check_auth(self, request: Request[Any, Any, Any]) -> None:
        """Raise ``UnauthorizedError`` unless the bearer token matches (when one is set)."""
        if not bearer_token_accepted(request.headers.get("authorization"), self.auth_token):
            raise UnauthorizedError(
                "this route changes adapters and needs 'Authorization: Bearer <token>' "
                "(the worker's DYN_SYSTEM_AUTH_TOKEN)"
            )


def reply_response(reply: UpdateReply) -> Response[Any]:
    """An engine reply as an HTTP JSON response; a 429 says when to try again."""
    return Response(reply.body, status_code=reply.status_code, media_type=MediaType.JSON,
                    headers=retry_after(reply.status_code))  # fmt: skip


def retry_after(status_code: int) -> dict[str, str]:
    """``Retry-After`` for a 429 (every slot pinned or busy: one may free up soon)."""
    return {"Retry-After": str(RETRY_AFTER_S)} if status_code == 429 else {}


def error_response(
    status_code: int, code: str, message: str, headers: dict[str, str] | None = None
) -> Response[Any]:
    """A JSON error body in the shape the engine routes use."""
    body = error_body(ErrorInfo(code=code, message=message))
    return Response(body, status_code=status_code, media_type=MediaType.JSON, headers=headers)


def _on_http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """Litestar's own errors (unknown route, bad method, body too large) in the routes' shape."""
    status = exc.status_code
    code = error_code(status)
    message = _HTTP_MESSAGES.get(status, exc.detail)
    if status == 404:
        message = f"no route {shorten(request.url.path)!r} on the worker's status server"
    if status == 405:
        message += f"; allowed: {(exc.headers or {}).get('allow', 'none')}"
    return error_response(status, code, message, exc.headers)


async def read_json_object(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The body as a JSON object: empty is ``{}``; anything else raises ``InvalidRequestError``."""
    raw = await request.body()
    if not raw.strip():
        return {}
    check_json_depth(raw)
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequestError(
            f"request body must be a JSON object, got {type(body).__name__}: "
            'send e.g. {"lora_name": "pirate"}'
        )
    return body


def is_mutating(path: str) -> bool:
    """Whether an engine route path changes state (``update/*`` except the ``list*`` ones)."""
    return path.startswith("update/") and not path.removeprefix("update/").startswith("list")


@get("/health", sync_to_thread=False)
def health(status: StatusState) -> Response[Any]:
    """200 while ready and NATS is connected; 503 while starting or stopping, and while
    NATS is down or the etcd lease has expired (naming which)."""
    body: dict[str, str] = {"status": status.phase.value}
    ready = status.phase is WorkerPhase.READY
    if status.nats is not None:
        body["nats"] = "connected" if status.nats.is_connected else "disconnected"
        body["nats_server"] = status.nats.server  # host:port in use, never credentials
        if ready and not status.nats.is_connected:
            ready = False
            body["status"] = "unhealthy"
            body["message"] = (
                "NATS is unreachable: this worker gets no requests until it reconnects "
                f"(reconnecting to {status.nats.settings.servers_text})"
            )
    if status.lease is not None:
        body["etcd"] = "lease expired" if status.lease.expired else "lease held"
        if ready and status.lease.expired:
            ready = False
            body["status"] = "unhealthy"
            body["message"] = (
                "etcd is unreachable and this worker's lease expired: its cards are gone, so "
                "frontends stop routing to it; it re-publishes them when etcd answers again"
            )
    body["instance_id"] = f"{status.instance_id:x}"
    return Response(body, status_code=200 if ready else 503)


@get("/metrics", sync_to_thread=False)
def metrics() -> Response[bytes]:
    """Prometheus text format."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


async def admitted_body(
    request: Request[Any, Any, Any], status: StatusState, *, mutating: bool
) -> dict[str, Any] | Response[Any]:
    """The JSON object body after the auth check, or the 400/401 response to send instead."""
    try:
        if mutating:
            status.check_auth(request)
        return await read_json_object(request)
    except (InvalidRequestError, UnauthorizedError) as exc:
        return error_response(http_status(exc.code), exc.code, exc.message)


@post("/engine/{path:path}", status_code=200)
async def engine_route(request: Request[Any, Any, Any], path: str, status: StatusState) -> Any:
    """Call ``control/<name>`` or ``update/<name>`` on the engine."""
    path = path.strip("/")
    body = await admitted_body(request, status, mutating=is_mutating(path))
    if isinstance(body, Response):
        return body
    return reply_response(await status.call(path, body))


def build_status_app(
    status: StatusState, extra_handlers: Sequence[BaseRouteHandler] = ()
) -> Litestar:
    """The status server app; ``extra_handlers`` are e.g. the ``/v1/loras`` routes."""
    return Litestar(
        route_handlers=[health, metrics, engine_route, *extra_handlers],
        dependencies={"status": Provide(lambda: status, sync_to_thread=False)},
        request_max_body_size=MAX_BODY_BYTES,
        exception_handlers={HTTPException: _on_http_error},
        openapi_config=None,
        logging_config=None,  # Litestar's default replaces the root handler: lines not JSON
    )


class StatusServer:
    """Runs the status app with uvicorn inside the worker's event loop."""

    def __init__(
        self, app: Litestar, host: str, port: int,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    ) -> None:  # fmt: skip
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", lifespan="off", log_config=None,
            access_log=False,
            http=with_header_timeout(header_timeout_s), timeout_graceful_shutdown=CLOSE_TIMEOUT_S,
        )  # fmt: skip
        self._server = UvicornServer(config)  # signals are the runtime's
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start serving; raises if the port cannot be bound."""
        self._task = asyncio.create_task(self._server.serve(), name="status-server")
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise OSError("status server stopped during start-up")
            await asyncio.sleep(0.01)

    async def aclose(self) -> None:
        """Stop serving: idle connections close now, running requests get ``CLOSE_TIMEOUT_S``."""
        self._server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
