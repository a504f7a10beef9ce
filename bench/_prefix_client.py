"""``bench.prefix``'s client: streamed chats on keep-alive connections, timed to the first token.

TTFT is taken when the first SSE event carrying text (or, from a server whose tokens
decode to no text, such as Dynamo's mocker, a finish reason) arrives. Each chat asks for
``usage`` (``stream_options.include_usage``) and keeps its prompt and cached tokens
(``prompt_tokens_details.cached_tokens``), so a stack whose workers cannot be scraped is
measured from its answers. The socket sets
``TCP_NODELAY`` and re-arms ``TCP_QUICKACK`` after every read, so the client never holds
an ACK back: a server that waits for one before sending its first token (Nagle's
algorithm against a delayed ACK, about 40 ms) shows that wait in its own figures, and the
same client measures every stack alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from bench._http import build_request

__all__ = ["ChatClient", "ChatResult"]

_QUICKACK: Final = getattr(socket, "TCP_QUICKACK", None)
_DONE: Final = b"[DONE]"


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Details(msgspec.Struct):
    cached_tokens: int = 0


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    prompt_tokens_details: _Details | None = None


class _Event(msgspec.Struct):
    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: _Usage | None = None


_event_decoder = msgspec.json.Decoder(_Event)


@dataclass(frozen=True)
class ChatResult:
    """One streamed chat: whether it succeeded, its answer, and its timings (seconds)."""

    ok: bool
    text: str
    started: float
    ttft_s: float | None
    ended: float
    prompt_tokens: int = 0
    cached_tokens: int = 0


class ChatClient:
    """One keep-alive connection to an OpenAI-compatible server; chats run one at a time."""

    def __init__(self, host: str, port: int, max_tokens: int, bearer: str = "") -> None:
        self.host, self.port, self.max_tokens, self.bearer = host, port, max_tokens, bearer
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def chat(self, model: str, messages: list[dict[str, str]]) -> ChatResult:
        """Stream one chat completion; a failure (status, error event, hang-up) is not ok."""
        body: dict[str, Any] = {"model": model, "messages": messages, "stream": True,
                                "max_tokens": self.max_tokens, "temperature": 0,
                                "stream_options": {"include_usage": True}}  # fmt: skip
        raw = build_request("POST", self.host, self.port, "/v1/chat/completions", body,
                            bearer=self.bearer)  # fmt: skip
        started = time.perf_counter()
        try:
            ok, text, first, usage = await self._exchange(raw)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            await self.close()
            ok, text, first, usage = False, "", None, _Usage()
        details = usage.prompt_tokens_details or _Details()
        return ChatResult(
            ok=ok, text=text, started=started, ended=time.perf_counter(),
            ttft_s=None if first is None else first - started,
            prompt_tokens=usage.prompt_tokens, cached_tokens=details.cached_tokens,
        )  # fmt: skip

    async def _exchange(self, raw: bytes) -> tuple[bool, str, float | None, _Usage]:
        reader, writer = await self._connection()
        writer.write(raw)
        head = await self._read(reader.readuntil(b"\r\n\r\n"))
        ok = head.split(b" ", 2)[1] == b"200"
        if b"transfer-encoding: chunked" not in head.lower():
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await self._read(reader.readexactly(length))
            return False, "", None, _Usage()
        parts: list[str] = []
        first: float | None = None
        usage = _Usage()
        while (size := int((await self._read(reader.readuntil(b"\r\n")))[:-2], 16)) > 0:
            data = (await self._read(reader.readexactly(size + 2)))[:-2]
            for line in data.split(b"\n"):
                if not line.startswith(b"data: ") or line[6:] == _DONE:
                    continue
                if line.startswith(b'data: {"error"'):
                    ok = False
                    continue
                event = _event_decoder.decode(line[6:])
                usage = event.usage or usage
                for choice in event.choices:
                    text = choice.delta.content if choice.delta is not None else None
                    if text or choice.finish_reason:
                        first = first or time.perf_counter()
                    parts.append(text or "")
        await self._read(reader.readuntil(b"\r\n"))
        return ok, "".join(parts), first, usage

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            sock = self._writer.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._reader, self._writer

    async def _read(self, pending: Any) -> bytes:
        """Await one read, then re-arm ``TCP_QUICKACK`` (Linux clears it after an ACK)."""
        data: bytes = await pending
        if _QUICKACK is not None and self._writer is not None:
            with contextlib.suppress(OSError):
                self._writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return data

    async def close(self) -> None:
        """Close the connection (the next chat opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None
