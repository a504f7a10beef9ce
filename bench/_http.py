"""A lean HTTP/1.1 keep-alive client on asyncio streams, so the load generator is cheap.

One connection per closed-loop task, requests pre-built as bytes, responses
read by ``Content-Length`` or chunked transfer encoding. It speaks only what
the frontend answers; it is no general HTTP client (use ``httpx`` for that).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass
from typing import Final

import msgspec

__all__ = [
    "HttpConnection",
    "HttpResponse",
    "build_request",
    "complete_stream",
    "http_get_json",
    "http_once",
]

_TOKEN_EVENT: Final = re.compile(rb'"(?:content|text)":"[^"]')
"""An SSE event carrying generated text (the chat opening frame has empty content)."""
_STREAM_LIMIT_BYTES: Final = 1 << 24
_DONE: Final = b"data: [DONE]\n\n"


@dataclass(slots=True)
class HttpResponse:
    """Status, body and, for streams, when the first token arrived (perf_counter)."""

    status: int
    body: bytes
    first_token_at: float | None = None


def complete_stream(response: HttpResponse) -> bool:
    """Whether an SSE answer succeeded: HTTP 200, no error event, ended by ``[DONE]``."""
    body = response.body
    return response.status == 200 and body.endswith(_DONE) and b'{"error"' not in body


def build_request(
    method: str, host: str, port: int, path: str, body: object = None, *, bearer: str = ""
) -> bytes:
    """The bytes of one keep-alive request (JSON body when ``body`` is not None; an
    ``Authorization: Bearer`` header when ``bearer`` is given)."""
    payload = b"" if body is None else msgspec.json.encode(body)
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: keep-alive\r\n"
    if bearer:
        head += f"Authorization: Bearer {bearer}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    return head.encode() + b"\r\n" + payload


class HttpConnection:
    """One keep-alive connection; requests on it run one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        """Connect to ``host:port``."""
        reader, writer = await asyncio.open_connection(host, port, limit=_STREAM_LIMIT_BYTES)
        return cls(reader, writer)

    async def request(self, raw: bytes, *, watch_tokens: bool = False) -> HttpResponse:
        """Send ``raw`` and read the whole answer; ``watch_tokens`` notes the first token."""
        self._writer.write(raw)
        status, headers = await self._read_head()
        if headers.get(b"transfer-encoding") == b"chunked":
            return await self._read_chunked(status, watch_tokens)
        length = int(headers.get(b"content-length", b"0"))
        return HttpResponse(status, await self._reader.readexactly(length))

    async def close(self) -> None:
        """Close the connection."""
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    async def _read_head(self) -> tuple[int, dict[bytes, bytes]]:
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def _read_chunked(self, status: int, watch_tokens: bool) -> HttpResponse:
        parts: list[bytes] = []
        first_token_at: float | None = None
        while True:
            size = int((await self._reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")
                break
            data = (await self._reader.readexactly(size + 2))[:-2]
            if watch_tokens and first_token_at is None and _TOKEN_EVENT.search(data):
                first_token_at = time.perf_counter()
            parts.append(data)
        return HttpResponse(status, b"".join(parts), first_token_at)


async def http_once(
    port: int, method: str, path: str, body: object = None, host: str = "127.0.0.1"
) -> HttpResponse:
    """One request on a fresh connection to ``host:port``."""
    connection = await HttpConnection.open(host, port)
    try:
        return await connection.request(build_request(method, host, port, path, body))
    finally:
        await connection.close()


async def http_get_json(host: str, port: int, path: str) -> tuple[int, object, int]:
    """One GET on a fresh connection: status, decoded JSON body and body size in bytes."""
    response = await http_once(port, "GET", path, host=host)
    return response.status, msgspec.json.decode(response.body), len(response.body)
