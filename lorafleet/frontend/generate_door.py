"""The one door of the two OpenAI generate routes: a raw ASGI app in front of Litestar.

Every ``POST`` to ``/v1/chat/completions`` or ``/v1/completions`` (a trailing slash
too) is answered here and only here, from its body to its last byte: the body read
within the body timeout (``frontend.request_body``), decoded into the route's request
type, generated through ``GenerationService`` and sent, or the error in OpenAI's shape.
Litestar serves every other route and method (a ``GET`` here is its 405), with the body
deadline and hang-up rule of ``bounded_receive``; its generate controllers only describe
these routes in the OpenAPI document (``controllers/_generate.py``). Litestar's routing,
dependency injection, signature model and response classes cost a third of the
frontend's CPU per request (``bench/README.md``), hence a door of its own.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Final

import msgspec
from litestar.datastructures import State
from litestar.enums import ScopeType
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import (
    ASGIApp,
    HTTPResponseBodyEvent,
    HTTPResponseStartEvent,
    HTTPScope,
    Receive,
    Scope,
    Send,
)

from lorafleet.frontend.access_log import current_record, logged
from lorafleet.frontend.admission import FleetAdmission
from lorafleet.frontend.errors import (
    RETRY_AFTER_S,
    FleetSaturatedError,
    openai_error,
    unexpected_error,
)
from lorafleet.frontend.exchange import SseAnswer
from lorafleet.frontend.generate_routes import GENERATE_ROUTES, GenerateRoute
from lorafleet.frontend.generation import SSE_HEADERS, SSE_MEDIA_TYPE, GenerationService
from lorafleet.frontend.metrics import FrontendMetrics
from lorafleet.frontend.request_body import (
    bounded_receive,
    decode_json,
    leaves_body_unread,
    read_body,
)
from lorafleet.frontend.services import services_of
from lorafleet.frontend.tenants import Permit
from lorafleet.proto.errors import LorafleetError, RateLimitedError
from lorafleet.proto.tenants import tenant_cache_salt

__all__ = ["GenerateDoor"]

_JSON_HEADERS: Final = (b"content-type", b"application/json")
_CLOSE: Final = (b"connection", b"close")
_BODYLESS_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
SATURATED: Final = "saturated"
"""The ``limit`` label of a tenant's requests shed while the fleet is saturated."""
_encoder: Final = msgspec.json.Encoder()


class GenerateDoor:
    """An ASGI app: the generate routes' ``POST``s, else ``fallback`` (Litestar's handler).

    ``state`` is the app's state: its ``services`` (set by the lifespan before any
    request) and ``metrics``; ``body_timeout_s`` bounds every request's body.
    """

    def __init__(self, fallback: ASGIApp, state: State, *, body_timeout_s: float) -> None:
        self._fallback = fallback
        self._state = state
        self._body_timeout_s = body_timeout_s
        self._routes: dict[str, GenerateRoute[Any]] = {}
        for route in GENERATE_ROUTES:
            self._routes[route.path] = self._routes[route.path + "/"] = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self._fallback(scope, receive, send)
            return
        route = self._routes.get(scope["path"]) if scope["method"] == "POST" else None
        if route is not None:
            started = time.perf_counter()  # the access line times the body's reading too
            answer = functools.partial(self._answer, route, scope, receive)
            await logged(scope, send, answer, started=started)
        elif scope["method"] in _BODYLESS_METHODS:
            await self._fallback(scope, receive, send)
        else:
            await self._fallback(scope, bounded_receive(receive, self._body_timeout_s), send)

    async def _answer(
        self, route: GenerateRoute[Any], scope: HTTPScope, receive: Receive, send: Send
    ) -> None:
        """Read, identify the caller's tenant, decode, admit (the tenant's limits, then a slot
        of the fleet by priority: ``frontend.admission``) and generate; send the answer
        or the error in OpenAI's shape."""
        services = services_of(self._state)
        record = current_record()
        try:
            body = await read_body(scope, bounded_receive(receive, self._body_timeout_s))
            # identified after the body, so that a refusal leaves the connection usable;
            # while the routes are open (no keys) there is no header to look for
            tenant = (
                services.tenants.identify(_authorization(scope)) if services.tenants.keyed else None
            )
            record.tenant = "" if tenant is None else tenant.name
            data: Any = decode_json(body, route.body_type)
            if tenant is not None and tenant.salt_cache:
                salt = tenant_cache_salt(tenant.name, data.cache_salt or "")
                data = msgspec.structs.replace(data, cache_salt=salt)
            permit = services.tenants.admit(tenant, data.model, services.registry.names)
            if services.admission.limited:  # else no coroutines to await (most frontends)
                await _enter(services.admission, permit)
        except LorafleetError as exc:
            status, error = openai_error(exc)
            metrics: FrontendMetrics = self._state.metrics
            metrics.rejected(route.shape.endpoint, status, exc.code)
            await _send_json(send, status, error, close=leaves_body_unread(exc),
                             retry_after_s=_retry_after_s(exc, status))  # fmt: skip
            return
        status = 500
        try:
            status = await _generate(services.generation, route, data, scope, receive, send)
        finally:
            services.admission.leave()
            permit.release(record, record.status or status)


async def _generate(
    generation: GenerationService, route: GenerateRoute[Any], data: Any, scope: HTTPScope,
    receive: Receive, send: Send,
) -> int:  # fmt: skip
    """Generate ``data``'s answer and send it; the status sent."""
    try:
        answer = await generation.generate(data, route.shape, route.to_generate, receive)
    except LorafleetError as exc:
        status, error = openai_error(exc)
        await _send_json(send, status, error, retry_after_s=_retry_after_s(exc, status))
        return status
    except Exception as exc:
        status, error = unexpected_error(exc, scope["path"])
        await _send_json(send, status, error)
        return status
    if isinstance(answer, SseAnswer):
        stream = ASGIStreamingResponse(
            iterator=answer, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS
        )
        await stream(scope, receive, send)
    else:
        await _send_json(send, 200, answer)
    return 200


async def _enter(admission: FleetAdmission, permit: Permit) -> None:
    """Take a slot of the fleet for an admitted request, or withdraw its permit (shed)."""
    try:
        await admission.enter(permit.priority, permit.tenant)
    except FleetSaturatedError:
        permit.withdraw(SATURATED)
        raise
    except BaseException:
        permit.withdraw(None)
        raise


def _retry_after_s(exc: LorafleetError, status: int) -> int | None:
    """The ``Retry-After`` of a 429 (``status``, as ``openai_error`` gives it: a worker's own
    429 is the answer's status, not the upstream error's 502): a tenant's own wait over a
    limit, else ``RETRY_AFTER_S`` (a full on-demand queue, a worker without a free slot);
    None for any other status."""
    if isinstance(exc, RateLimitedError):
        return exc.retry_after_s
    return RETRY_AFTER_S if status == 429 else None


def _authorization(scope: HTTPScope) -> str | None:
    """The request's ``Authorization`` header, if any."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value.decode("latin-1")
    return None


async def _send_json(
    send: Send, status: int, body: msgspec.Struct, close: bool = False,
    retry_after_s: int | None = None,
) -> None:  # fmt: skip
    """Send ``body`` as JSON with ``status``; ``close``: the connection ends after it;
    ``retry_after_s``: a ``Retry-After`` header (a tenant over a limit)."""
    encoded = _encoder.encode(body)
    headers = [_JSON_HEADERS, (b"content-length", str(len(encoded)).encode())]
    if close:
        headers.append(_CLOSE)
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    start: HTTPResponseStartEvent = {
        "type": "http.response.start", "status": status, "headers": headers
    }  # fmt: skip
    body_event: HTTPResponseBodyEvent = {
        "type": "http.response.body",
        "body": encoded,
        "more_body": False,
    }
    await send(start)
    await send(body_event)
