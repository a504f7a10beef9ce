"""Fault injection for tests: a TCP proxy whose link can be cut and restored.

Putting a proxy between a process and etcd (or NATS) simulates a network
partition without stopping the server other clients use.
"""

from __future__ import annotations

import asyncio
import contextlib

from lorafleet.launch.local_servers import free_port


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target_port``.

    ``cut()`` drops every connection (the peer sees a reset); ``stall()`` keeps
    them open but forwards nothing (a hung server, a half-open network);
    ``cut_when_sent(pattern)`` cuts the moment a client sends ``pattern`` (an etcd key
    travels as plain bytes in gRPC), so a fault can land on one exact step of a start-up.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self.is_cut = False
        self.is_stalled = False
        self.cut_pattern: bytes | None = None
        self.was_cut = asyncio.Event()

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Drop every open connection and refuse new ones until ``restore()``."""
        self.is_cut = True
        self.was_cut.set()
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()

    def cut_when_sent(self, pattern: bytes) -> None:
        """Cut (as ``cut()``) when a client sends ``pattern``, which is not forwarded."""
        self.cut_pattern = pattern

    def stall(self) -> None:
        """Keep every connection open but forward no byte, until ``restore()``."""
        self.is_stalled = True

    def restore(self) -> None:
        self.is_cut = False
        self.is_stalled = False

    async def aclose(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._links.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer, from_client=True), self._pipe(up_reader, writer)
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, from_client=False
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if from_client and self.cut_pattern is not None and self.cut_pattern in data:
                    self.cut_pattern = None
                    self.cut()
                if self.is_cut:
                    break
                if self.is_stalled:
                    continue
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
        self._links.discard(writer)
