"""A request's body, read within its deadline and decoded, or the 4xx that says why not.

Every way a body can fail is one of our errors, so every route answers it in OpenAI's
shape and the metrics count it as the client's: too large (413), not arrived within the
body timeout (408), the client gone before its end (499), not JSON or not the request
type (400). ``frontend.generate_door`` reads the generate routes' bodies here;
``bounded_receive`` gives Litestar's routes the same deadline and hang-up rule, and
``frontend.json_request`` decodes their JSON through ``decode_json``.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Final, TypeVar

import msgspec
from litestar.types import HTTPScope, Receive, ReceiveMessage
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from lorafleet.frontend.access_log import current_record
from lorafleet.frontend.errors import (
    BodyTimeoutError,
    BodyTooLargeError,
    ClientGoneError,
    InvalidBodyError,
)
from lorafleet.proto.limits import check_json_depth

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "MAX_BODY_BYTES",
    "bounded_receive",
    "decode_json",
    "describe_problem",
    "leaves_body_unread",
    "read_body",
]

_T = TypeVar("_T")

MAX_BODY_BYTES: Final = 10_000_000
"""Largest HTTP body read (Litestar's default); what reaches a worker must also fit NATS."""
DEFAULT_BODY_TIMEOUT_S: Final = 30.0
"""How long a request's body may take to arrive after its headers (``DYN_BODY_TIMEOUT_S``)."""
_CONTENT_LENGTH: Final = b"content-length"
_MISSING_FIELD: Final = re.compile(r"missing required field `([^`]+)`")
_AT_PATH: Final = re.compile(r" - at `\$\.?(.*)`$")


def leaves_body_unread(exc: Exception) -> bool:
    """Whether ``exc`` is answered before its body's end; its connection must then close
    (``Connection: close``), or the rest of the body would be read as the next request."""
    return isinstance(exc, BodyTimeoutError | BodyTooLargeError)


def bounded_receive(receive: Receive, timeout_s: float) -> Receive:
    """``receive`` whose body messages must all arrive within ``timeout_s`` from now
    (``BodyTimeoutError``) and before the client hangs up (``ClientGoneError``); once the
    body is complete it is ``receive`` itself."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    body_done = False

    async def receive_body() -> ReceiveMessage:
        nonlocal body_done
        if body_done:
            return await receive()
        if _holds_message(receive):  # no wait, so no timer (most bodies come with their head)
            message = await receive()
        else:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeoutError(timeout_s) from None
        if message["type"] == "http.disconnect":
            raise ClientGoneError(current_record().request_id, "while sending its body")
        body_done = not message.get("more_body", False)
        return message

    return receive_body


def _holds_message(receive: Receive) -> bool:
    """Whether ``receive`` is a uvicorn request cycle's with its next message (body or
    hang-up) already there, so that awaiting it returns at once: its ``message_event`` is
    set by every part of a body and by a hang-up, and only ``receive`` clears it."""
    cycle = getattr(receive, "__self__", None)
    return isinstance(cycle, RequestResponseCycle) and cycle.message_event.is_set()


async def read_body(scope: HTTPScope, receive: Receive) -> bytes:
    """The whole body of the request, at most ``MAX_BODY_BYTES`` (``BodyTooLargeError``,
    before reading when ``content-length`` says so); ``receive`` bounds its time."""
    for name, value in scope["headers"]:
        if name == _CONTENT_LENGTH:
            if not value.isdigit():
                raise InvalidBodyError(f"Invalid content-length header: {value[:32]!r}")
            if int(value) > MAX_BODY_BYTES:
                raise BodyTooLargeError(MAX_BODY_BYTES)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        chunk = message["body"] if message["type"] == "http.request" else b""
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BodyTooLargeError(MAX_BODY_BYTES)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def decode_json(body: bytes, body_type: type[_T] | Any = Any, *, strict: bool = False) -> _T:
    """``body`` as ``body_type``; ``InvalidBodyError`` naming the problem and the field when
    it is not, and when it nests deeper than ``MAX_JSON_DEPTH`` (msgspec would recurse: a
    500). Unless ``strict``, strings of numbers are accepted as numbers, as OpenAI's and
    vLLM's servers accept them; the admin routes' records are decoded ``strict``."""
    if not body or body.isspace():  # no stripped copy of a large body
        raise InvalidBodyError("Invalid request body: the body is empty; send a JSON object")
    check_json_depth(body)
    try:
        decoded: _T = msgspec.json.decode(body, type=body_type, strict=strict)
    except msgspec.ValidationError as exc:
        message, param = _describe_validation(str(exc))
        raise InvalidBodyError(message, param) from None
    except msgspec.DecodeError as exc:
        raise InvalidBodyError(f"Invalid request body: not valid JSON: {exc}") from None
    return decoded


def _describe_validation(error: str) -> tuple[str, str | None]:
    """Message and param for msgspec's ``problem - at `$.path```."""
    at = _AT_PATH.search(error)
    if at is None:
        return describe_problem("", error)
    return describe_problem(at.group(1), error[: at.start()])


def describe_problem(key: str, problem: str) -> tuple[str, str | None]:
    """A message naming one validation ``problem`` at ``key`` (``""``: the body itself),
    and the field it is about when it is one."""
    missing = _MISSING_FIELD.search(problem)
    if missing:
        param = f"{key}.{missing.group(1)}" if key else missing.group(1)
        return f"Invalid request body: {param}: required field is missing", param
    if not key:
        return f"Invalid request body: {problem}", None
    return f"Invalid request body: {key}: {problem}", key
