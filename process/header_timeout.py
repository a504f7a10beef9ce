"""An HTTP protocol for uvicorn that closes connections which send no request head in time.

uvicorn closes idle keep-alive connections, but never one that sends nothing, or half
a request line, after it opens: 2,000 such connections stayed open on a frontend. The
worker's status server and the frontend both serve through this protocol, which is why it
lives in ``process``. Only the request head is timed: bodies are bounded by the shutdown
grace.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar, Final

from lorafleet.process.response_head import HeadWithBodyProtocol

__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "HeaderTimeoutProtocol", "with_header_timeout"]

DEFAULT_HEADER_TIMEOUT_S: Final = 10.0
"""How long a connection may take to send a complete request line and headers."""


class HeaderTimeoutProtocol(HeadWithBodyProtocol):
    """uvicorn's httptools protocol (each response's head and body in one write), plus a
    timer from connect (or the last response) to the end of the next request's headers;
    when it fires, the connection closes."""

    header_timeout_s: ClassVar[float] = DEFAULT_HEADER_TIMEOUT_S
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


def with_header_timeout(timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class to pass as uvicorn's ``http=``, with its own header timeout."""
    if timeout_s <= 0:
        raise ValueError(f"header timeout must be positive, got {timeout_s}")
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": timeout_s})
