"""An HTTP protocol for uvicorn that closes connections which send no request head in time.

uvicorn closes idle keep-alive connections, but never one that sends nothing, or half
a request line, after it opens: 2,000 such connections stayed open on a frontend. The
worker's status server and the frontend both serve through this protocol, which is why it
lives in ``process``. Only the request head is timed: bodies are bounded by the shutdown
grace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ClassVar, Final, TypeAlias

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from lorafleet.process.response_head import HeadWithBodyProtocol

__all__ = [
    "BadRequestBody",
    "DEFAULT_HEADER_TIMEOUT_S",
    "HeaderTimeoutProtocol",
    "with_header_timeout",
]

BadRequestBody: TypeAlias = Callable[[str], bytes]
"""The JSON body of the 400 answered to a request uvicorn cannot parse, from its reason."""

DEFAULT_HEADER_TIMEOUT_S: Final = 10.0
"""How long a connection may take to send a complete request line and headers."""


class HeaderTimeoutProtocol(HeadWithBodyProtocol):
    """uvicorn's httptools protocol (each response's head and body in one write), plus a
    timer from connect (or the last response) to the end of the next request's headers;
    when it fires, the connection closes."""

    header_timeout_s: ClassVar[float] = DEFAULT_HEADER_TIMEOUT_S
    bad_request_body: ClassVar[BadRequestBody | None] = None
    """The server's JSON error shape for unparsable requests; None: uvicorn's plain text."""
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.pipeline and not self.transport.is_closing():
            self._arm_header_timer()  # the next request on this keep-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse (bad framing, a bad request line),
        in the server's JSON error shape when it has one; the connection closes."""
        render = type(self).bad_request_body
        if render is None:
            super().send_400_response(msg)
            return
        body = render(msg)
        head = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._close_slow_client)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _close_slow_client(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def with_header_timeout(
    timeout_s: float, bad_request_body: BadRequestBody | None = None
) -> type[HeaderTimeoutProtocol]:
    """The protocol class to pass as uvicorn's ``http=``, with its own header timeout and
    (``bad_request_body``) its own JSON body for the 400s of unparsable requests."""
    if timeout_s <= 0:
        raise ValueError(f"header timeout must be positive, got {timeout_s}")
    render = None if bad_request_body is None else staticmethod(bad_request_body)
    settings = {"header_timeout_s": timeout_s, "bad_request_body": render}
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), settings)
