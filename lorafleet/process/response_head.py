"""An HTTP protocol for uvicorn that sends a response's head and its body in one write.

uvicorn's httptools protocol writes the status line and headers as soon as the app
sends ``http.response.start``, and the body at ``http.response.body``: two writes, two
system calls, for every whole answer (a tenth of the frontend's CPU at concurrency 64,
``bench/README.md``). Here each request's first write is held until its next write
joins it, or until the event loop's next turn when none comes in this one (a stream
whose body waits, a 100-continue), so nothing waits longer than that turn.
``header_timeout``'s protocol builds on it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["HeadWithBodyProtocol"]


class HeadWithBodyProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose request cycles write through a ``_HeldHead``."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.transport is self.transport:
            self.cycle.transport = _HeldHead(self.transport, self.loop)  # type: ignore[assignment]


class _HeldHead:
    """One request's view of the connection's transport: its first write waits for the
    second (or the loop's next turn) and both go out as one."""

    __slots__ = ("_head", "_loop", "_transport", "_written")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None
        self._written = False

    def write(self, data: bytes) -> None:
        """Hold the first write; send it with the next one."""
        if not self._written:
            self._written = True
            self._head = data
            self._loop.call_soon(self._flush)
            return
        if self._head is not None:
            data, self._head = self._head + data, None
        self._transport.write(data)

    def close(self) -> None:
        """Send what is held, then close the connection."""
        self._flush()
        self._transport.close()

    def _flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
