"""Send a generate request to an instance that serves its model, retrying while nothing is sent.

An attempt on an instance is lost when the server says nobody subscribes its
subject, or when its replies stall and it does not answer a ``PingRequest``.
A lost attempt, or one the worker refuses with a retryable error, moves on to
another instance while nothing has been committed to the client: until the
first chunk for a stream, until the final chunk for a whole completion.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

import msgspec
import structlog

from frontend.errors import InstanceLostError, NoLiveInstanceError, WorkerError
from frontend.registry import ServedModel
from frontend.request_plane import Reply, RequestPlane, is_no_responders
from frontend.router import Router
from proto.discovery import Instance
from proto.errors import LorafleetError, UpstreamError, error_from_info
from proto.inference import (
    ErrorChunk,
    FinalChunk,
    GenerateRequest,
    StreamChunk,
    TokenChunk,
    decode_chunk,
)

__all__ = [
    "Completion",
    "DispatchSettings",
    "Dispatcher",
    "TokenStream",
]

log = structlog.get_logger(__name__)

FAILOVER_PAUSE_S: Final = 0.25
"""Wait before re-trying an instance nobody answered for, when no other is left: a worker
whose NATS node died is back on another node within tens of milliseconds."""
RETRYABLE_WORKER_CODES: Final = frozenset({"unavailable", "not_found", "capacity"})
"""Worker errors that another instance may not have (shutting down, adapter gone, full)."""


@dataclass(frozen=True, kw_only=True)
class DispatchSettings:
    """How patient the dispatcher is.

    Examples::

        DispatchSettings()                               # defaults
        DispatchSettings(stall_s=5.0, max_attempts=2)    # slow engines, fewer retries
    """

    stall_s: float = 1.0
    ping_timeout_s: float = 2.0
    max_attempts: int = 3
    quarantine_s: float = 5.0
    """How long an instance that was lost gets no new requests (unless no other is left)."""

    def __post_init__(self) -> None:
        if self.stall_s <= 0 or self.ping_timeout_s <= 0 or self.quarantine_s < 0:
            raise ValueError("stall_s and ping_timeout_s must be positive, quarantine_s >= 0")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")


@dataclass(kw_only=True)
class Completion:
    """A whole answer: text, why it ended, token counts, and when the first token came."""

    text: str
    final: FinalChunk
    instance: Instance
    first_token_at: float | None = None
    """``time.perf_counter()`` when the first token arrived, if any did."""


@dataclass(kw_only=True, slots=True)
class _Attempt:
    """One try of a request on one instance."""

    instance: Instance
    reply: Reply
    request_id: str


class TokenStream:
    """The chunks of a streamed answer; the first one already arrived. ``close()`` when done."""

    def __init__(
        self, dispatcher: Dispatcher, attempt: _Attempt, request_id: str, first: StreamChunk
    ) -> None:
        self._dispatcher = dispatcher
        self._attempt = attempt
        self.request_id = request_id
        self.first = first
        self.instance = attempt.instance
        self._done = False

    async def __aiter__(self) -> AsyncIterator[TokenChunk | FinalChunk]:
        """Yield token chunks and the final chunk; raise a ``LorafleetError`` on failure."""
        chunk = self.first
        while True:
            if isinstance(chunk, ErrorChunk):
                self._done = True
                raise WorkerError(self.instance.instance_id, error_from_info(chunk.error))
            yield chunk
            if isinstance(chunk, FinalChunk):
                self._done = True
                return
            try:
                chunk = await self._dispatcher._next_chunk(self._attempt)
            except InstanceLostError as exc:
                self._done = True
                lost = UpstreamError(f"it stopped answering mid-stream ({exc.reason})")
                raise WorkerError(self.instance.instance_id, lost) from exc

    @property
    def buffered(self) -> bool:
        """Whether more chunks already arrived, so the next step will not wait."""
        return self._attempt.reply.pending > 0

    def close(self) -> None:
        """Release the attempt; if the answer did not finish, cancel it at the worker."""
        self._dispatcher._finish(self._attempt)
        if not self._done:
            self._done = True
            self._dispatcher.plane.cancel(self.instance.subject, self.request_id)


class Dispatcher:
    """Routes generate requests to instances and reads their answers, with retries."""

    def __init__(
        self, plane: RequestPlane, router: Router, settings: DispatchSettings | None = None
    ) -> None:
        self.plane = plane
        self.router = router
        self.settings = settings or DispatchSettings()
        self._quarantine: dict[int, float] = {}

    async def complete(self, served: ServedModel, request: GenerateRequest) -> Completion:
        """Run ``request`` to its final chunk, retrying on other instances until then."""
        tried: list[int] = []
        forgiven: set[int] = set()
        last: LorafleetError | None = None
        while len(tried) < self.settings.max_attempts:
            attempt = await self._start(served, request, tried, last)
            try:
                return await self._collect(attempt)
            except (InstanceLostError, WorkerError) as exc:
                last = self._retryable_or_raise(exc, attempt)
                await self._forgive_failover(exc, served, tried, forgiven)
            except BaseException:
                self.plane.cancel(attempt.instance.subject, request.request_id)
                raise
            finally:
                self._finish(attempt)
        raise self._exhausted(served, tried, last)

    async def stream(self, served: ServedModel, request: GenerateRequest) -> TokenStream:
        """Start ``request`` and wait for its first chunk, retrying elsewhere until then."""
        tried: list[int] = []
        forgiven: set[int] = set()
        last: LorafleetError | None = None
        while len(tried) < self.settings.max_attempts:
            attempt = await self._start(served, request, tried, last)
            try:
                first = await self._next_chunk(attempt)
            except InstanceLostError as exc:
                self._finish(attempt)
                last = self._retryable_or_raise(exc, attempt)
                await self._forgive_failover(exc, served, tried, forgiven)
                continue
            except BaseException:
                self._finish(attempt)
                self.plane.cancel(attempt.instance.subject, request.request_id)
                raise
            if isinstance(first, ErrorChunk):
                error = WorkerError(attempt.instance.instance_id, error_from_info(first.error))
                self._finish(attempt)
                last = self._retryable_or_raise(error, attempt)
                continue
            return TokenStream(self, attempt, request.request_id, first)
        raise self._exhausted(served, tried, last)

    async def _start(
        self,
        served: ServedModel,
        request: GenerateRequest,
        tried: list[int],
        last: LorafleetError | None,
    ) -> _Attempt:
        pick = self.router.pick if served.parent is None else self.router.pick_least_inflight
        instance = None
        if self._quarantine:
            instance = pick(served.name, served.instances, self._avoid(tried))
        if instance is None:
            instance = pick(served.name, served.instances, tried)
        if instance is None:
            raise self._exhausted(served, tried, last)
        tried.append(instance.instance_id)
        self.router.started(instance.instance_id)
        try:
            reply = await self.plane.open(instance.subject, request)
        except BaseException:
            self.router.finished(instance.instance_id)
            raise
        return _Attempt(instance=instance, reply=reply, request_id=request.request_id)

    async def _collect(self, attempt: _Attempt) -> Completion:
        parts: list[str] = []
        first_token_at: float | None = None
        while True:
            chunk = await self._next_chunk(attempt)
            if isinstance(chunk, TokenChunk):
                if first_token_at is None:
                    first_token_at = time.perf_counter()
                parts.append(chunk.text)
            elif isinstance(chunk, FinalChunk):
                text = "".join(parts)
                return Completion(
                    text=text, final=chunk, instance=attempt.instance, first_token_at=first_token_at
                )
            else:
                raise WorkerError(attempt.instance.instance_id, error_from_info(chunk.error))

    async def _next_chunk(self, attempt: _Attempt) -> StreamChunk:
        """The next chunk of ``attempt``; raises ``InstanceLostError`` if its worker is gone."""
        instance = attempt.instance
        while True:
            msg = await attempt.reply.next(self.settings.stall_s)
            if msg is None and attempt.reply.dropped:
                reason = "the frontend's NATS link dropped, so its replies may be lost"
                raise InstanceLostError(
                    instance.instance_id, reason, stalled=True, link_dropped=True
                )
            if msg is None:
                timeout_s, request_id = self.settings.ping_timeout_s, attempt.request_id
                if not await self.plane.ping(instance.subject, timeout_s, request_id):
                    raise InstanceLostError(
                        instance.instance_id, "it stopped answering or lost the request",
                        stalled=True,
                    )  # fmt: skip
                continue
            if is_no_responders(msg):
                raise InstanceLostError(
                    instance.instance_id, "no responder on its subject", no_responders=True
                )
            try:
                return decode_chunk(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("undecodable chunk", instance=f"{instance.instance_id:x}", error=str(exc))
                raise InstanceLostError(instance.instance_id, f"undecodable reply: {exc}") from exc

    def _avoid(self, tried: list[int]) -> set[int]:
        """Instances tried for this request and those still in quarantine."""
        now = time.monotonic()
        for instance_id, until in list(self._quarantine.items()):
            if until <= now:
                del self._quarantine[instance_id]
        return {*tried, *self._quarantine}

    def _finish(self, attempt: _Attempt) -> None:
        if not attempt.reply._closed:
            attempt.reply.close()
            self.router.finished(attempt.instance.instance_id)

    def _retryable_or_raise(
        self, exc: InstanceLostError | WorkerError, attempt: _Attempt
    ) -> LorafleetError:
        if isinstance(exc, WorkerError) and exc.error.code not in RETRYABLE_WORKER_CODES:
            raise exc
        if isinstance(exc, InstanceLostError):
            if not exc.link_dropped:  # our own link's fault, not the instance's
                self._quarantine[exc.instance_id] = time.monotonic() + self.settings.quarantine_s
            if exc.stalled:  # it may be alive but wedged: do not let it work for nobody
                self.plane.cancel(attempt.instance.subject, attempt.request_id)
        log.info("retrying on another instance", instance=f"{attempt.instance.instance_id:x}",
                 reason=exc.message)  # fmt: skip
        return exc

    async def _forgive_failover(
        self, exc: LorafleetError, served: ServedModel, tried: list[int], forgiven: set[int]
    ) -> None:
        """Let an instance lost to a NATS fail-over be tried once more: at once when this
        frontend's own link dropped; when nobody answered its subject (its node may have
        died a moment ago) only after ``FAILOVER_PAUSE_S``, and only if no other fresh
        instance is left. A single-instance model thus survives a NATS node's death."""
        if not isinstance(exc, InstanceLostError) or exc.instance_id in forgiven:
            return
        if not (exc.link_dropped or exc.no_responders):
            return
        forgiven.add(exc.instance_id)
        tried.remove(exc.instance_id)
        if exc.no_responders and not self._fresh_instances(served, tried, forgiven):
            await asyncio.sleep(FAILOVER_PAUSE_S)

    def _fresh_instances(
        self, served: ServedModel, tried: list[int], forgiven: set[int]
    ) -> list[Instance]:
        avoid = {*self._avoid(tried), *forgiven}
        return [i for i in served.instances if i.instance_id not in avoid]

    def _exhausted(
        self, served: ServedModel, tried: list[int], last: LorafleetError | None
    ) -> LorafleetError:
        if isinstance(last, WorkerError):
            return last
        return NoLiveInstanceError(served.name, tried)
