"""The one NATS connection of a process: connect once, then reconnect forever, never die silently.

``NatsConnection.connect`` is a single attempt (one pass over ``NATS_SERVER``) that
raises our error; a start-up retry loop goes around it. Once connected, nats-py
reconnects forever, waiting our capped, jittered backoff (``process.backoff``)
between failed tries; the list's servers are failed over in turn. Should the
library close the connection anyway (a server's ``-ERR`` after a credentials
reload), the owner's ``on_lost`` callback runs so the process can exit non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import ssl
import time
from collections.abc import Callable
from typing import Final, TypeAlias

import nats
import structlog
from nats.aio.client import Client as NatsClient

from lorafleet.discovery.errors import NatsAuthError, NatsConnectError
from lorafleet.discovery.nats_settings import NatsSettings
from lorafleet.process.backoff import backoff_s

__all__ = [
    "DEFAULT_INBOX_PREFIX",
    "LostCallback",
    "NATS_CONNECT_TIMEOUT_S",
    "NATS_RECONNECT_CAP_S",
    "NatsConnection",
    "NatsState",
    "StateListener",
    "WORKER_INBOX_PREFIX",
    "flush_subscriptions",
]

log = structlog.get_logger(__name__)

NATS_CONNECT_TIMEOUT_S: Final = 2
NATS_RECONNECT_CAP_S: Final = 2.0
"""Longest wait between reconnect tries, so a returning server is used within ~2 s."""
NATS_PING_INTERVAL_S: Final = 5
NATS_MAX_OUTSTANDING_PINGS: Final = 3
"""A server that stops answering (half-open network) is left after about 15-20 s."""
_TRIES_PER_SERVER_AT_START: Final = 1
"""nats-py tries each server this many times more than once (so twice) in one attempt."""
_DROP_NOTICE_POLL_S: Final = 0.01
_AUTH_MARKERS: Final = ("authorization violation", "authentication", "user authentication")

DEFAULT_INBOX_PREFIX: Final = "_INBOX"
"""Reply subjects of frontends and tools: ``_INBOX.{nuid}.{token}``."""
WORKER_INBOX_PREFIX: Final = "_INBOX_WORKER"
"""Reply subjects of workers (their start-up self-check); workers may not read ``_INBOX.>``."""

LostCallback: TypeAlias = Callable[[], None]
"""Called once when the connection closed for good without ``aclose()``: exit non-zero."""
StateListener: TypeAlias = Callable[["NatsState"], None]
"""Called on every state change, e.g. to fail requests whose replies a dropped link lost."""


class NatsState(enum.Enum):
    """Where the connection stands; changed only by ``_set_state``."""

    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    CLOSED = "closed"


class NatsConnection:
    """Owns a nats-py client: its callbacks, reconnect backoff, state and unexpected close.

    Examples::

        conn = await NatsConnection.connect(NatsSettings.from_env(), name="worker-12")
        conn = await NatsConnection.connect(settings, name="frontend", on_lost=exit_1)
        async with conn: await conn.client.publish(...)
    """

    def __init__(self, settings: NatsSettings, name: str, on_lost: LostCallback | None) -> None:
        self.settings = settings
        self.name = name
        self.state = NatsState.CONNECTING
        self._on_lost = on_lost
        self._client: NatsClient | None = None
        self._failures = 0
        self._last_reason = ""
        self._down_since: float | None = None
        self._start_errors: list[BaseException] = []
        self._listeners: list[StateListener] = []
        self._connected = asyncio.Event()

    @classmethod
    async def connect(
        cls,
        settings: NatsSettings,
        *,
        name: str,
        on_lost: LostCallback | None = None,
        inbox_prefix: str = DEFAULT_INBOX_PREFIX,
    ) -> NatsConnection:
        """One attempt over the server list; raises ``NatsAuthError`` or ``NatsConnectError``.

        ``inbox_prefix`` keeps a role's reply subjects apart (``WORKER_INBOX_PREFIX``), so
        that NATS authorization can let only frontends read ``_INBOX.>``.
        """
        conn = cls(settings, name, on_lost)
        client = conn._client = NatsClient()
        try:
            async with asyncio.timeout(_attempt_timeout_s(settings)):
                await client.connect(
                    list(settings.servers), name=name, connect_timeout=NATS_CONNECT_TIMEOUT_S,
                    allow_reconnect=True, max_reconnect_attempts=_TRIES_PER_SERVER_AT_START,
                    reconnect_time_wait=0, ping_interval=NATS_PING_INTERVAL_S,
                    max_outstanding_pings=NATS_MAX_OUTSTANDING_PINGS,
                    error_cb=conn._on_error, disconnected_cb=conn._on_disconnected,
                    reconnected_cb=conn._on_reconnected, closed_cb=conn._on_closed,
                    inbox_prefix=inbox_prefix, **settings.connect_options(),
                )  # fmt: skip
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            conn._start_errors.append(exc)
            await conn._abandon()
            raise conn._start_failure() from exc
        conn._client.options["max_reconnect_attempts"] = -1  # read on every reconnect: forever
        conn._set_state(NatsState.CONNECTED)
        log.info("nats connected", server=conn.server, name=name)
        return conn

    async def __aenter__(self) -> NatsConnection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def client(self) -> NatsClient:
        """The nats-py client (subscriptions survive reconnects)."""
        assert self._client is not None, "NatsConnection.connect() returns a connected one"
        return self._client

    @property
    def is_connected(self) -> bool:
        """Whether messages reach a server right now."""
        return self.state is NatsState.CONNECTED and self.client.is_connected

    @property
    def server(self) -> str:
        """``host:port`` of the server in use (no credentials), or '' while none is."""
        url = self._client.connected_url if self._client is not None else None
        return f"{url.hostname}:{url.port}" if url is not None else ""

    def add_listener(self, listener: StateListener) -> None:
        """Call ``listener`` with the new state on every change from now on."""
        self._listeners.append(listener)

    async def wait_connected(self, timeout_s: float) -> bool:
        """Whether the connection is up, waiting at most ``timeout_s`` for a reconnect."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.is_connected:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self._connected.is_set():  # nats-py saw the drop and calls us back any moment
                await asyncio.sleep(min(remaining, _DROP_NOTICE_POLL_S))
                continue
            try:
                async with asyncio.timeout(remaining):
                    await self._connected.wait()
            except TimeoutError:
                return False
        return True

    async def aclose(self) -> None:
        """Drain and close on purpose; ``on_lost`` is not called."""
        if self.state is NatsState.CLOSED:
            return
        self._set_state(NatsState.CLOSED)
        client = self._client
        if client is None or client.is_closed:
            return
        try:
            await client.drain()
        except Exception as exc:
            log.warning("nats drain failed", error=str(exc))
            await client.close()

    async def _abandon(self) -> None:
        """Stop a failed first attempt's client (nats-py can hang after a TLS failure)."""
        self._set_state(NatsState.CLOSED)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(NATS_CONNECT_TIMEOUT_S):
                await self.client.close()

    def _set_state(self, state: NatsState) -> None:
        self.state = state
        if state is NatsState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        for listener in self._listeners:
            listener(state)

    def _start_failure(self) -> NatsConnectError:
        """Our error for a failed first attempt: credentials and TLS are named, and permanent."""
        for exc in self._start_errors:
            if isinstance(exc, ssl.SSLError):
                check = self.settings.tls_variables
                return NatsAuthError(servers=self.settings.servers_text, reason=_reason(exc),
                                     check=f"{check} (TLS failed)")  # fmt: skip
            if _is_auth_error(exc):
                return NatsAuthError(servers=self.settings.servers_text, reason=_reason(exc),
                                     check=self.settings.auth_variables)  # fmt: skip
        causes = [e for e in self._start_errors if not isinstance(e, nats.errors.NoServersError)]
        reasons = list(dict.fromkeys(map(_reason, causes or self._start_errors)))
        return NatsConnectError(servers=self.settings.servers_text, reason="; ".join(reasons))

    async def _on_error(self, exc: Exception) -> None:
        if self.state is NatsState.CONNECTING:
            self._start_errors.append(exc)
            return
        reason = _reason(exc)
        if "permissions violation" in reason.lower():
            log.warning("nats permission denied", error=reason, name=self.name)
            return
        if self.state is NatsState.RECONNECTING and self._client is not None:
            self._failures += 1
            wait_s = backoff_s(self._failures, cap_s=NATS_RECONNECT_CAP_S)
            self._client.options["reconnect_time_wait"] = wait_s
        if reason != self._last_reason:  # once per change, not once per try
            self._last_reason = reason
            log.warning("nats error", error=reason, servers=self.settings.servers_text)

    async def _on_disconnected(self) -> None:
        if self.state is not NatsState.CONNECTED:
            return
        self._set_state(NatsState.RECONNECTING)
        self._down_since = time.monotonic()
        log.warning("nats disconnected; reconnecting", servers=self.settings.servers_text)

    async def _on_reconnected(self) -> None:
        down_s = time.monotonic() - self._down_since if self._down_since else 0.0
        self._set_state(NatsState.CONNECTED)
        self._failures, self._last_reason, self._down_since = 0, "", None
        if self._client is not None:  # the next outage starts again without a wait
            self._client.options["reconnect_time_wait"] = 0
        log.info("nats reconnected", server=self.server, down_s=round(down_s, 3))

    async def _on_closed(self) -> None:
        if self.state in (NatsState.CLOSED, NatsState.CONNECTING):
            return
        self._set_state(NatsState.CLOSED)
        log.error("nats connection closed for good; the process cannot serve without it",
                  servers=self.settings.servers_text, name=self.name)  # fmt: skip
        if self._on_lost is not None:
            self._on_lost()


async def flush_subscriptions(client: NatsClient) -> None:
    """Return once the server holds every subscription ``client`` made so far.

    nats-py's ``flush()`` writes its PING straight to the socket, ahead of the SUB that
    ``subscribe()`` left in its pending buffer, so its PONG can come back before the server
    knows the subscription: a publisher on another connection then gets "no responders".
    The first flush lets the library's flusher write the SUB; the second PING follows it.
    """
    await client.flush()
    await client.flush()


def _attempt_timeout_s(settings: NatsSettings) -> float:
    """Bound of one attempt: every try of every server may take the connect timeout."""
    return NATS_CONNECT_TIMEOUT_S * (_TRIES_PER_SERVER_AT_START + 1) * len(settings.servers)


def _is_auth_error(exc: BaseException) -> bool:
    if isinstance(exc, nats.errors.AuthorizationError):
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _AUTH_MARKERS)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
