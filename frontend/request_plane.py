"""The NATS client side of the request plane: publish to an instance, read its replies.

One NATS connection and one wildcard subscription on ``{inbox}.*`` serve every
request; each request gets its own reply subject ``{inbox}.{token}`` and the
subscription routes messages to it by the token (as nats-py's request mux does),
so a request costs no SUB/UNSUB round trip. A message with header
``Status: 503`` on a reply subject is the server saying nobody subscribes to
the instance subject. Do no routing or retrying here (see ``dispatcher``).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from typing import Final

import msgspec
import nats
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from frontend.errors import PayloadTooLargeError
from proto.errors import UnavailableError
from proto.inference import CancelRequest, PingRequest, encode_msg

__all__ = ["Reply", "RequestPlane", "connect_nats", "is_no_responders"]

log = structlog.get_logger(__name__)

NATS_CONNECT_TIMEOUT_S: Final = 3.0
NATS_RECONNECT_WAIT_S: Final = 0.5
NATS_START_ATTEMPTS: Final = 3
"""Tries per server at start; once connected the client reconnects forever."""
_STATUS_HEADER: Final = "Status"
_NO_RESPONDERS: Final = "503"


def is_no_responders(msg: Msg) -> bool:
    """Whether ``msg`` is the server's 'no responders' status instead of a reply."""
    headers = msg.headers
    return headers is not None and headers.get(_STATUS_HEADER) == _NO_RESPONDERS


async def connect_nats(servers: str, *, name: str = "lorafleet-frontend") -> NatsClient:
    """Connect to NATS, reconnecting forever once connected; ``UnavailableError`` at start."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats error", error=str(exc))

    async def on_disconnected() -> None:
        if client and not (client[0].is_closed or client[0].is_draining):
            log.warning("nats disconnected", servers=servers)

    async def on_reconnected() -> None:
        log.info("nats reconnected", servers=servers)

    client: list[NatsClient] = []
    try:
        nc = await nats.connect(
            servers.split(","),
            name=name,
            connect_timeout=NATS_CONNECT_TIMEOUT_S,
            reconnect_time_wait=NATS_RECONNECT_WAIT_S,
            max_reconnect_attempts=NATS_START_ATTEMPTS - 1,
            allow_reconnect=True,
            error_cb=on_error,
            disconnected_cb=on_disconnected,
            reconnected_cb=on_reconnected,
        )
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        raise UnavailableError(
            f"NATS at {servers} is unavailable ({exc or type(exc).__name__}); "
            "check that nats-server is running and NATS_SERVER points at it"
        ) from exc
    nc.options["max_reconnect_attempts"] = -1  # read on every reconnect: never give up
    client.append(nc)
    return nc


class Reply:
    """The messages of one request's reply subject, in order; ``close()`` when done."""

    __slots__ = ("_closed", "_messages", "_plane", "_waiter", "subject", "token")

    def __init__(self, plane: RequestPlane, token: str, subject: str) -> None:
        self._plane = plane
        self.token = token
        self.subject = subject
        self._messages: collections.deque[Msg] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Messages that arrived and were not read yet."""
        return len(self._messages)

    def push(self, msg: Msg) -> None:
        """Queue one message and wake the reader."""
        self._messages.append(msg)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self, timeout_s: float) -> Msg | None:
        """The next message, or None when ``timeout_s`` passes without one."""
        if not self._messages:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout_s, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
            if not self._messages:
                return None
        return self._messages.popleft()

    def close(self) -> None:
        """Stop routing messages here; later replies are dropped."""
        if not self._closed:
            self._closed = True
            self._plane._replies.pop(self.token, None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class RequestPlane:
    """Sends request-plane messages to instance subjects and routes their replies."""

    def __init__(self, nc: NatsClient) -> None:
        self.nc = nc
        self._inbox = nc.new_inbox() + "."
        self._replies: dict[str, Reply] = {}
        self._tokens = itertools.count(1)
        self._background: set[asyncio.Task[None]] = set()
        self._subscription: Subscription | None = None

    @classmethod
    async def start(cls, nc: NatsClient) -> RequestPlane:
        """Subscribe the shared reply inbox and make sure the server has it."""
        plane = cls(nc)
        plane._subscription = await nc.subscribe(plane._inbox + "*", cb=plane._route)
        await nc.flush()
        return plane

    @property
    def open_replies(self) -> int:
        """How many requests wait for replies right now."""
        return len(self._replies)

    async def open(
        self, subject: str, message: msgspec.Struct, *, headers: dict[str, str] | None = None
    ) -> Reply:
        """Publish ``message`` (with NATS ``headers``) to ``subject`` with a fresh reply subject.

        Raises ``PayloadTooLargeError`` (413), before publishing anything, when the
        encoded message exceeds the server's ``max_payload`` (from its INFO).
        """
        payload = encode_msg(message)
        if len(payload) > self.nc.max_payload:
            raise PayloadTooLargeError(len(payload), self.nc.max_payload)
        token = format(next(self._tokens), "x")
        reply = Reply(self, token, self._inbox + token)
        self._replies[token] = reply
        try:
            await self.nc.publish(subject, payload, reply=reply.subject, headers=headers)
        except Exception as exc:
            reply.close()
            raise UnavailableError(f"cannot publish to NATS subject {subject!r}: {exc}") from exc
        return reply

    async def ping(self, subject: str, timeout_s: float) -> bool:
        """Whether a live worker answers a ``PingRequest`` on ``subject`` within ``timeout_s``."""
        try:
            reply = await self.open(subject, PingRequest())
        except UnavailableError:
            return False
        try:
            msg = await reply.next(timeout_s)
        finally:
            reply.close()
        return msg is not None and not is_no_responders(msg)

    def cancel(self, subject: str, request_id: str) -> None:
        """Tell the instance on ``subject`` to stop ``request_id``; never waits, never raises."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called from a finalizer outside the loop: nothing to send with
            return
        task = loop.create_task(self._send_cancel(subject, request_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        """Send pending cancels, then drain and close the connection."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        for reply in list(self._replies.values()):
            reply.close()
        if not self.nc.is_closed:
            try:
                await self.nc.drain()
            except Exception as exc:
                log.warning("nats drain failed", error=str(exc))
                await self.nc.close()

    async def _send_cancel(self, subject: str, request_id: str) -> None:
        try:
            await self.nc.publish(subject, encode_msg(CancelRequest(request_id=request_id)))
        except Exception as exc:
            log.warning("cancel not sent", subject=subject, request_id=request_id, error=str(exc))

    async def _route(self, msg: Msg) -> None:
        reply = self._replies.get(msg.subject[len(self._inbox) :])
        if reply is not None:
            reply.push(msg)
