"""Answer the two OpenAI generate routes straight from ASGI, before Litestar's per-request layers.

At concurrency 64 Litestar's routing, dependency injection, signature model and
response classes cost about as much CPU as the request itself (``bench/README.md``).
``GenerateFastPath`` sits in front of Litestar's handler and answers ``POST
/v1/chat/completions`` and ``POST /v1/completions`` itself whenever the body decodes
into its request type as Litestar would (depth check, then msgspec with
``strict=False``; in one pass, where Litestar decodes to Python objects first). Every
other request, and every body it cannot decode or that is too large, goes to Litestar
with the messages already read replayed, so those answers (400, 413, 405, ...) are
Litestar's own, word for word. Both paths write the same access line, request id and
metrics, and the controllers still give the OpenAPI document (and serve the routes
reached another way, such as with a trailing slash). Do not add behaviour here that the
controllers lack.
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
    ReceiveMessage,
    Scope,
    Send,
)

from lorafleet.frontend.access_log import logged
from lorafleet.frontend.errors import openai_error, unexpected_error
from lorafleet.frontend.exchange import SseAnswer
from lorafleet.frontend.generate_routes import GENERATE_ROUTES, GenerateRoute
from lorafleet.frontend.generation import SSE_HEADERS, SSE_MEDIA_TYPE
from lorafleet.frontend.services import services_of
from lorafleet.proto.errors import LorafleetError
from lorafleet.proto.limits import check_json_depth

__all__ = ["GenerateFastPath", "MAX_BODY_BYTES"]

MAX_BODY_BYTES: Final = 10_000_000
"""Largest HTTP body read (Litestar's default); what reaches a worker must also fit NATS."""
_CONTENT_LENGTH: Final = b"content-length"
_JSON_HEADERS: Final = (b"content-type", b"application/json")
_encoder: Final = msgspec.json.Encoder()


class GenerateFastPath:
    """An ASGI app: the generate routes it can decode, else ``fallback`` (Litestar's handler).

    ``state`` is the app's state, whose ``services`` the lifespan sets before any request.
    """

    def __init__(self, fallback: ASGIApp, state: State) -> None:
        self._fallback = fallback
        self._state = state
        self._routes: dict[str, GenerateRoute[Any]] = {r.path: r for r in GENERATE_ROUTES}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or scope["method"] != "POST":
            await self._fallback(scope, receive, send)
            return
        route = self._routes.get(scope["path"])
        if route is None or _declared_too_large(scope):
            await self._fallback(scope, receive, send)
            return
        started = time.perf_counter()  # the access line times the body's reading too
        messages, body = await _read_body(receive)
        data = None if body is None else _decode(route, body)
        if data is None:  # Litestar reads the same messages and answers with its error
            await self._fallback(scope, _replaying(messages, receive), send)
            return
        answer = functools.partial(self._answer, route, data, scope, receive)
        await logged(scope, send, answer, started=started)

    async def _answer(
        self, route: GenerateRoute[Any], data: Any, scope: HTTPScope, receive: Receive, send: Send
    ) -> None:
        """Generate, and send the answer as the controllers' exception handlers would."""
        generation = services_of(self._state).generation
        try:
            answer = await generation.generate(data, route.shape, route.to_generate, receive)
        except LorafleetError as exc:
            await _send_json(send, *openai_error(exc))
            return
        except Exception as exc:  # Litestar's catch-all answers the same 500
            await _send_json(send, *unexpected_error(exc, scope["path"]))
            return
        if isinstance(answer, SseAnswer):
            stream = ASGIStreamingResponse(
                iterator=answer, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS
            )
            await stream(scope, receive, send)
        else:
            await _send_json(send, 200, answer)


def _declared_too_large(scope: HTTPScope) -> bool:
    """Whether the ``content-length`` header says more than Litestar would read."""
    for name, value in scope["headers"]:
        if name == _CONTENT_LENGTH:
            return not value.isdigit() or int(value) > MAX_BODY_BYTES
    return False


async def _read_body(receive: Receive) -> tuple[list[ReceiveMessage], bytes | None]:
    """The messages read and the whole body; ``None`` when the client left or sent too much."""
    messages: list[ReceiveMessage] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        size += len(message["body"])
        if size > MAX_BODY_BYTES:
            return messages, None
        if not message.get("more_body", False):
            break
    bodies = [m["body"] for m in messages if m["type"] == "http.request"]
    return messages, bodies[0] if len(bodies) == 1 else b"".join(bodies)


def _decode(route: GenerateRoute[Any], body: bytes) -> Any:
    """``body`` as ``route``'s request type, as Litestar decodes it; ``None`` if it cannot."""
    try:
        check_json_depth(body)
        return msgspec.json.decode(body, type=route.body_type, strict=False)
    except (LorafleetError, msgspec.MsgspecError):
        return None


def _replaying(messages: list[ReceiveMessage], receive: Receive) -> Receive:
    """A ``receive`` that gives ``messages`` again, then what ``receive`` gives."""
    pending = iter(messages)

    async def replay() -> ReceiveMessage:
        message = next(pending, None)
        return message if message is not None else await receive()

    return replay


async def _send_json(send: Send, status: int, body: msgspec.Struct) -> None:
    """Send ``body`` as JSON with ``status``: the headers Litestar's ``Response`` sends."""
    encoded = _encoder.encode(body)
    start: HTTPResponseStartEvent = {
        "type": "http.response.start", "status": status,
        "headers": [_JSON_HEADERS, (b"content-length", str(len(encoded)).encode())],
    }  # fmt: skip
    body_event: HTTPResponseBodyEvent = {
        "type": "http.response.body",
        "body": encoded,
        "more_body": False,
    }
    await send(start)
    await send(body_event)
