"""Fault injection for tests: a TCP proxy whose link can be cut and restored.

Putting a proxy between a process and etcd (or NATS) simulates a network
partition without stopping the server other clients use.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from lorafleet.launch.local_servers import free_port


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target_port``.

    ``cut()`` drops every connection (the peer sees a reset); ``stall()`` keeps
    them open but forwards nothing (a hung server, a half-open network), or, with
    ``downstream=False`` or ``upstream=False``, holds one direction only (a one-way
    partition: the target hears the client but its answers never come back, or the reverse);
    ``hold()`` stops forwarding (either direction or both) but loses no byte: what was sent
    arrives on ``restore()``, as TCP retransmits across a network partition that heals;
    ``delay(s)`` forwards every byte, in order, ``s`` late (a slow link: a watch behind).
    ``cut_when_sent(pattern)`` and ``stall_when_sent(pattern)`` do so the moment a client
    sends ``pattern`` (an etcd key travels as plain bytes in gRPC, an S3 key in the HTTP
    request line), so a fault lands on one exact step: of a start-up, of a download.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[object]] = set()
        self.is_cut = False
        self.holds_upstream = False
        """Bytes from clients to the target are dropped (``stall``)."""
        self.holds_downstream = False
        """Bytes from the target to clients are dropped (``stall``)."""
        self._flowing = {True: asyncio.Event(), False: asyncio.Event()}
        """Per direction (``True``: client to target), set unless ``hold()`` holds it."""
        for flowing in self._flowing.values():
            flowing.set()
        self.delay_s = 0.0
        self._trigger: tuple[bytes, Callable[[], None]] | None = None
        self.was_cut = asyncio.Event()
        self.was_stalled = asyncio.Event()

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
        for flowing in self._flowing.values():
            flowing.set()  # held pipes wake up and stop
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()

    def cut_when_sent(self, pattern: bytes) -> None:
        """Cut (as ``cut()``) when a client sends ``pattern``, which is not forwarded."""
        self._trigger = (pattern, self.cut)

    def stall_when_sent(self, pattern: bytes) -> None:
        """Stall (as ``stall()``) when a client sends ``pattern``, which is not forwarded."""
        self._trigger = (pattern, self.stall)

    def stall(self, *, upstream: bool = True, downstream: bool = True) -> None:
        """Keep every connection open but drop the bytes sent ``upstream`` (client to target)
        and ``downstream`` (target to client), until ``restore()``."""
        self.holds_upstream = upstream
        self.holds_downstream = downstream
        self.was_stalled.set()

    def hold(self, *, upstream: bool = True, downstream: bool = True) -> None:
        """Stop forwarding ``upstream`` (client to target) and ``downstream`` bytes without
        losing them, until ``restore()``; connections stay open and new ones are accepted."""
        if upstream:
            self._flowing[True].clear()
        if downstream:
            self._flowing[False].clear()

    @property
    def is_stalled(self) -> bool:
        """Whether bytes of either direction are dropped."""
        return self.holds_upstream or self.holds_downstream

    def delay(self, seconds: float) -> None:
        """Forward every chunk ``seconds`` after it came, in order, until ``restore()``."""
        self.delay_s = seconds

    def restore(self) -> None:
        self.is_cut = False
        self.holds_upstream = self.holds_downstream = False
        for flowing in self._flowing.values():
            flowing.set()
        self.delay_s = 0.0

    async def aclose(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await asyncio.gather(*self._handlers, return_exceptions=True)

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
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)  # so that aclose() waits for it: none left pending
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, from_client=True), self._pipe(up_reader, writer)
            )
        finally:
            self._handlers.discard(handler)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, from_client=False
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if from_client and self._trigger is not None and self._trigger[0] in data:
                    fault = self._trigger[1]
                    self._trigger = None
                    fault()
                if self.is_cut:
                    break
                if self.holds_upstream if from_client else self.holds_downstream:
                    continue
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                await self._flowing[from_client].wait()
                if self.is_cut:
                    break
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
        self._links.discard(writer)
