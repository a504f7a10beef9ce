"""Start-up that waits for etcd and NATS without flooding logs, and that a signal can stop.

``connect_with_retry`` wraps one connect attempt (``connect_etcd``, ``NatsConnection.connect``)
in a bounded retry loop; ``unless_stopped`` runs a start-up so that SIGTERM ends it at
once. Both the worker and the frontend use them; keep connection details out of here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeVar

import structlog

from lorafleet.process.backoff import backoff_s
from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.errors import UnavailableError

__all__ = [
    "ConnectTimeoutError",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "connect_with_retry",
    "unless_stopped",
]

log = structlog.get_logger(__name__)

T = TypeVar("T")

DEFAULT_CONNECT_TIMEOUT_S: Final = 60.0
"""How long a process waits at start-up for each of etcd and NATS before it exits 1."""
MAX_RETRY_DELAY_S: Final = 2.0


class ConnectTimeoutError(UnavailableError):
    """A dependency stayed unreachable for the whole connect timeout at start-up."""

    def __init__(
        self, *, service: str, url: str, timeout_s: float, reason: str, check: str
    ) -> None:
        self.service = service
        self.url = url
        super().__init__(
            f"gave up on {service} at {url} after {timeout_s:g} s (--connect-timeout-s, "
            f"DYN_CONNECT_TIMEOUT_S); last error: {reason}; check {check}"
        )


async def connect_with_retry(
    connect: Callable[[], Awaitable[T]], *, service: str, url: str, timeout_s: float, check: str
) -> T:
    """Call ``connect`` until it succeeds, for at most ``timeout_s``.

    Retries ``UnavailableError`` unless it is ``permanent`` (wrong credentials, a bad
    certificate); anything else propagates at once. Logs a warning when the reason for
    failing changes (each attempt only at debug level), and one line once connected.
    """
    started = time.monotonic()
    failures, last_reason = 0, ""
    while True:
        try:
            async with asyncio.timeout(started + timeout_s - time.monotonic()):
                result = await connect()
        except (UnavailableError, TimeoutError) as exc:
            if isinstance(exc, UnavailableError) and exc.permanent:
                raise
            reason = _reason(exc)
            if time.monotonic() - started >= timeout_s:
                raise ConnectTimeoutError(
                    service=service, url=url, timeout_s=timeout_s,
                    reason=last_reason or reason, check=check,
                ) from exc  # fmt: skip
            failures += 1
            _log_failure(service, url, reason, changed=reason != last_reason)
            last_reason = reason
            await _sleep_within(backoff_s(failures, cap_s=MAX_RETRY_DELAY_S), started, timeout_s)
            continue
        if failures:
            log.info(f"{service} reachable", url=url, waited_s=round(time.monotonic() - started, 1))
        return result


async def unless_stopped(start: Coroutine[Any, Any, T], stop: asyncio.Event) -> T | None:
    """Run ``start`` unless ``stop`` is set first; then cancel it and return None.

    The cancellation is repeated until ``start`` ends: a library may swallow one (Python
    3.11's ``asyncio.wait_for`` does when its inner call completes at the same moment, as
    in nats-py's connect on a loaded machine), and the process would then wait for the
    whole connect timeout instead of stopping.
    """
    task = asyncio.ensure_future(start)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        await cancel_and_wait(task)
    if task.cancelled():
        return None
    return task.result()


async def _sleep_within(delay_s: float, started: float, timeout_s: float) -> None:
    """Sleep ``delay_s`` but not past the deadline, so the last attempt comes in time."""
    await asyncio.sleep(max(0.0, min(delay_s, started + timeout_s - time.monotonic())))


def _log_failure(service: str, url: str, reason: str, *, changed: bool) -> None:
    """A warning when the reason changed, so a long wait is one line; debug otherwise."""
    if changed:
        log.warning(f"waiting for {service}", url=url, reason=reason)
    else:
        log.debug(f"still waiting for {service}", url=url, reason=reason)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "connect attempt timed out"
    message = getattr(exc, "message", "") or str(exc) or type(exc).__name__
    return message.splitlines()[0][:300]
