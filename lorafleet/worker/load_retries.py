"""Placement's failed loads: when to try each again, and one log line per state change.

A desired adapter that cannot load is retried with ``process.backoff``'s capped
exponential backoff (up to ``RETRY_CAP_S``), not every pass. Its last failure
(code, message with URIs redacted, attempts, next try) goes into the load
record, so ``/v1/adapters`` can show it. The message is kept whole: it is this
worker's own, and its fix is often at its end (``set DYN_LORA_ALLOW_PICKLE=true``);
the caller's text in it is already bounded (names by validation, URIs by
``LoraSourceError``). A load refused for size (over ``DYN_LORA_MAX_BYTES``) is not
retried at all until the adapter's declared source changes: the same source would be
downloaded, and refused, again (its ``retry_at`` is 0). The log says when an adapter
starts failing, when its error changes and when it recovers; a retry failing the same
way again is logged at debug level only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Final

import structlog

from lorafleet.process.backoff import backoff_s
from lorafleet.proto.errors import LorafleetError
from lorafleet.proto.fleet_load import LoadFailure
from lorafleet.proto.limits import shorten
from lorafleet.proto.uris import redact_uri, redact_uris_in
from lorafleet.worker.lora.errors import LoraTooLargeError

__all__ = ["LoadRetries"]

log = structlog.get_logger(__name__)

RETRY_BASE_S: Final = 1.0
"""The backoff's base: the first retry comes within 2 s, the n-th within 2^n s."""
RETRY_CAP_S: Final = 180.0
"""The longest wait between two tries of one adapter."""
RETRIED_EVENT: Final = "placement could not load adapter; retrying with backoff"
NOT_RETRIED_EVENT: Final = "placement could not load adapter; not retrying until its source changes"


class LoadRetries:
    """The adapters whose placement load failed, by name, until one succeeds.

    Example::

        retries = LoadRetries()
        if retries.due("pirate"):
            try: ... load ...
            except LorafleetError as exc: retries.failed("pirate", uri, exc)
            else: retries.succeeded("pirate")
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._failures: dict[str, LoadFailure] = {}
        self._tried: dict[str, object] = {}
        """What each failing adapter was loaded from (its ``source``): another one is due now."""

    @property
    def failures(self) -> dict[str, LoadFailure]:
        """The last failure of each adapter still failing."""
        return dict(self._failures)

    def due(self, name: str, source: object = None) -> bool:
        """Whether ``name`` may be tried now from ``source``: never failed, its backoff is
        over (never, after a refusal for size), or the source changed (a fixed URI or
        ``sha256`` is not made to wait)."""
        failure = self._failures.get(name)
        if failure is None or self._tried.get(name) != source:
            return True
        return _retried(failure) and self._clock() >= failure.retry_at

    def next_retry_in_s(self) -> float | None:
        """Seconds until the earliest retry, None when nothing failed."""
        retry_ats = [f.retry_at for f in self._failures.values() if _retried(f)]
        if not retry_ats:
            return None
        return max(0.0, min(retry_ats) - self._clock())

    def failed(self, name: str, uri: str, exc: LorafleetError, source: object = None) -> None:
        """Record a failed load of ``name`` from ``uri`` (``source``, compared by
        :meth:`due`) and schedule the next try."""
        self._tried[name] = source
        previous = self._failures.get(name)
        attempts = 1 if previous is None else previous.attempts + 1
        now = self._clock()
        permanent = isinstance(exc, LoraTooLargeError)
        delay_s = None if permanent else backoff_s(attempts, cap_s=RETRY_CAP_S, base_s=RETRY_BASE_S)
        message = redact_uris_in(exc.message)
        self._failures[name] = LoadFailure(
            code=exc.code, message=message, at=now, attempts=attempts,
            retry_at=0.0 if delay_s is None else now + delay_s, uri=redact_uri(uri),
        )  # fmt: skip
        same = previous is not None and (previous.code, previous.message) == (exc.code, message)
        report = log.debug if same else log.warning
        event = NOT_RETRIED_EVENT if permanent else RETRIED_EVENT
        report(event, adapter=name,
               uri=shorten(redact_uri(uri)), code=exc.code, error=message, attempts=attempts,
               retry_in_s=None if delay_s is None else round(delay_s, 1))  # fmt: skip

    def succeeded(self, name: str) -> None:
        """``name`` loaded: forget its failure, and say so if it had failed."""
        previous = self._failures.pop(name, None)
        self._tried.pop(name, None)
        if previous is not None:
            log.info("adapter loads again", adapter=name, failed_attempts=previous.attempts)

    def retain(self, names: Collection[str]) -> None:
        """Forget failures of adapters no longer placed here (deleted, or moved elsewhere)."""
        for name in [name for name in self._failures if name not in names]:
            del self._failures[name]
            self._tried.pop(name, None)


def _retried(failure: LoadFailure) -> bool:
    """Whether placement tries the failed load again (not after a refusal for size)."""
    return failure.retry_at > 0
