"""The NATS client side of the request plane: publish to an instance, read its replies.

One NATS connection and one wildcard subscription on ``{inbox}.*`` serve every
request; each request gets its own reply subject ``{inbox}.{token}`` and the
subscription routes messages to it by the token (as nats-py's request mux does),
so a request costs no SUB/UNSUB round trip. A message with header
``Status: 503`` on a reply subject is the server saying nobody subscribes to
the instance subject. While the connection is down, ``open`` fails at once with
``NatsUnavailableError`` (after a short grace for a fail-over to another
server) instead of buffering a request nobody will answer; when the link drops,
every open reply is marked ``dropped``, because messages sent meanwhile are lost.
``Reply.receive`` is the one reading loop: wait with a stall timeout, ping the
instance when it is silent (or at once when another request just lost it: ``wake_all``),
and decode what arrives, or say the instance is lost.
A failed ping is judged only after the messages that came before its pong: an
instance answers "not running that request" right after it sent the request's last
chunk, and one NATS connection delivers in order.
Do no routing or retrying here (see ``dispatcher``); the connection itself is
owned by ``discovery.NatsConnection``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Callable
from typing import Final, Protocol, TypeVar

import msgspec
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from lorafleet.discovery.nats_connection import NatsConnection, NatsState, flush_subscriptions
from lorafleet.frontend.errors import InstanceLostError, PayloadTooLargeError
from lorafleet.proto.errors import NatsUnavailableError, UnavailableError
from lorafleet.proto.inference import CancelRequest, PingRequest, UpdateReply, encode_msg

__all__ = ["Patience", "Reply", "RequestPlane", "is_no_responders"]

log = structlog.get_logger(__name__)

_Decoded = TypeVar("_Decoded")

NATS_RECONNECT_GRACE_S: Final = 0.25
"""How long a new request waits for a dropped NATS link to come back before its 503."""
_STATUS_HEADER: Final = "Status"
_NO_RESPONDERS: Final = "503"


def is_no_responders(msg: Msg) -> bool:
    """Whether ``msg`` is the server's 'no responders' status instead of a reply."""
    headers = msg.headers
    return headers is not None and headers.get(_STATUS_HEADER) == _NO_RESPONDERS


class Patience(Protocol):
    """How long a reply may be silent before its instance is pinged, and how long the ping
    may take (``DispatchSettings`` is one)."""

    @property
    def stall_s(self) -> float:
        """Silence, in seconds, after which the instance is pinged."""

    @property
    def ping_timeout_s(self) -> float:
        """How long the instance has to answer the ping."""


class Reply:
    """The messages of one request's reply subject, in order; ``close()`` when done."""

    __slots__ = (
        "_closed", "_messages", "_plane", "_waiter", "dropped", "subject", "target", "token",
    )  # fmt: skip

    def __init__(self, plane: RequestPlane, token: str, subject: str, target: str) -> None:
        self._plane = plane
        self.token = token
        self.subject = subject
        self.target = target
        """The subject the request went to: the instance to ping when its replies stall."""
        self._messages: collections.deque[Msg] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self.dropped = False
        """The NATS link dropped while this reply was open: messages may be lost."""

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

    def drop(self) -> None:
        """Mark the reply as one whose messages may be lost, and wake the reader."""
        self.dropped = True
        self.wake()

    def wake(self) -> None:
        """End the reader's wait now, as if its stall had passed: ``receive`` pings."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self, timeout_s: float) -> Msg | None:
        """The next message, or None when ``timeout_s`` passes without one (or it dropped)."""
        if not self._messages and not self.dropped:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout_s, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return self._messages.popleft() if self._messages else None

    async def receive(
        self,
        decode: Callable[[bytes], _Decoded],
        instance_id: int,
        patience: Patience,
        *,
        request_id: str = "",
    ) -> _Decoded:
        """The next message, decoded; pings the instance whenever it is silent for a stall.

        Raises ``InstanceLostError`` when nobody subscribes the instance's subject, when
        it is silent and does not answer a ping (given ``request_id``: or no longer runs
        that request) and nothing arrived meanwhile, when this frontend's link dropped, or
        when the message does not decode.
        """
        while True:
            msg = await self.next(patience.stall_s)
            if msg is None and self.dropped:
                reason = "the frontend's NATS link dropped, so its replies may be lost"
                raise InstanceLostError(instance_id, reason, stalled=True, link_dropped=True)
            if msg is None:
                answered = await self._plane.ping(self.target, patience.ping_timeout_s, request_id)
                # A pong saying the request is not running may come right after its last
                # messages (the instance sends in order): read those before judging.
                if not answered and not self._messages:
                    lost = " or lost the request" if request_id else ""
                    reason = f"it stopped answering{lost}"
                    raise InstanceLostError(instance_id, reason, stalled=True)
                continue
            if is_no_responders(msg):
                reason = ("no responder on its subject: it exited, or no NATS route joins "
                          "its server to this frontend's")  # fmt: skip
                raise InstanceLostError(instance_id, reason, no_responders=True)
            try:
                return decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("undecodable reply", instance=f"{instance_id:x}", error=str(exc))
                raise InstanceLostError(instance_id, f"undecodable reply: {exc}") from exc

    @property
    def closed(self) -> bool:
        """Whether ``close()`` ran: messages are no longer routed here."""
        return self._closed

    def close(self) -> None:
        """Stop routing messages here; later replies are dropped."""
        if not self._closed:
            self._closed = True
            self._plane.detach(self)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class RequestPlane:
    """Sends request-plane messages to instance subjects and routes their replies."""

    def __init__(self, connection: NatsConnection) -> None:
        self.connection = connection
        self.nc = connection.client
        self._inbox = self.nc.new_inbox() + "."
        self._replies: dict[str, Reply] = {}
        self._tokens = itertools.count(1)
        self._background: set[asyncio.Task[None]] = set()
        self._subscription: Subscription | None = None

    @classmethod
    async def start(cls, connection: NatsConnection) -> RequestPlane:
        """Subscribe the shared reply inbox and make sure the server has it."""
        plane = cls(connection)
        plane._subscription = await plane.nc.subscribe(plane._inbox + "*", cb=plane._route)
        await flush_subscriptions(plane.nc)
        connection.add_listener(plane._on_nats_state)
        return plane

    @property
    def open_replies(self) -> int:
        """How many requests wait for replies right now."""
        return len(self._replies)

    async def open(
        self, subject: str, message: msgspec.Struct, *, headers: dict[str, str] | None = None
    ) -> Reply:
        """Publish ``message`` (with NATS ``headers``) to ``subject`` with a fresh reply subject.

        Raises ``NatsUnavailableError`` when the connection stays down for the grace, and
        ``PayloadTooLargeError`` (413), before publishing anything, when the encoded
        message exceeds the server's ``max_payload`` (from its INFO).
        """
        connected = self.connection.is_connected  # skips a coroutine on every request
        if not connected and not await self.connection.wait_connected(NATS_RECONNECT_GRACE_S):
            servers = self.connection.settings.servers_text
            raise NatsUnavailableError(
                f"this frontend's NATS connection ({servers}) is down and reconnecting, so no "
                "worker can be reached; check nats-server and NATS_SERVER",
                subject=subject,
            )
        payload = encode_msg(message)
        if len(payload) > self.nc.max_payload:
            raise PayloadTooLargeError(len(payload), self.nc.max_payload)
        token = format(next(self._tokens), "x")
        reply = Reply(self, token, self._inbox + token, subject)
        self._replies[token] = reply
        try:
            await self.nc.publish(subject, payload, reply=reply.subject, headers=headers)
        except Exception as exc:
            reply.close()
            raise UnavailableError(f"cannot publish to NATS subject {subject!r}: {exc}") from exc
        return reply

    async def ping(self, subject: str, timeout_s: float, request_id: str = "") -> bool:
        """Whether a live worker answers a ``PingRequest`` on ``subject`` within ``timeout_s``
        (and, given ``request_id``, says it is still running that request)."""
        try:
            reply = await self.open(subject, PingRequest(request_id=request_id))
        except UnavailableError:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        msg = None
        try:
            while msg is None and not reply.dropped and (left := deadline - loop.time()) > 0:
                msg = await reply.next(left)  # ``wake_all`` may end a wait early
        finally:
            reply.close()
        if msg is None or is_no_responders(msg):
            return False
        try:
            return msgspec.msgpack.decode(msg.data, type=UpdateReply).status_code == 200
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False

    def wake_all(self, subject: str) -> None:
        """Wake every request waiting on the instance of ``subject``, so each pings it now
        rather than at the end of its own stall: another request just lost that instance."""
        for reply in list(self._replies.values()):
            if reply.target == subject:
                reply.wake()

    def detach(self, reply: Reply) -> None:
        """Stop routing messages to ``reply`` (its ``close()`` calls this)."""
        self._replies.pop(reply.token, None)

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
        """Send pending cancels and stop routing replies; the connection's owner closes it."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        for reply in list(self._replies.values()):
            reply.close()
        if self._subscription is not None and not self.nc.is_closed:
            try:
                await self._subscription.unsubscribe()
            except Exception as exc:
                log.warning("nats unsubscribe failed", error=str(exc))

    async def _send_cancel(self, subject: str, request_id: str) -> None:
        try:
            await self.nc.publish(subject, encode_msg(CancelRequest(request_id=request_id)))
        except Exception as exc:
            log.warning("cancel not sent", subject=subject, request_id=request_id, error=str(exc))

    def _on_nats_state(self, state: NatsState) -> None:
        if state is not NatsState.CONNECTED:
            for reply in list(self._replies.values()):
                reply.drop()

    async def _route(self, msg: Msg) -> None:
        reply = self._replies.get(msg.subject[len(self._inbox) :])
        if reply is not None:
            reply.push(msg)
