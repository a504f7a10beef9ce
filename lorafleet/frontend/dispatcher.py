"""Send a generate request to an instance that serves its model, retrying while nothing is sent.

An attempt on an instance is lost when the server says nobody subscribes its
subject, or when its replies stall and it does not answer a ``PingRequest``.
A lost instance is kept out of routing until it answers a ping
(``frontend.reachability``). A lost attempt, or one the worker refuses with a retryable
error, moves on to another instance while nothing has been committed to the client:
until the first chunk for a stream, until the final chunk for a whole completion.
A stream lost later is continued elsewhere by ``frontend.token_stream``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Annotated, Final

import structlog

from lorafleet.frontend.attempt import Attempt
from lorafleet.frontend.errors import InstanceLostError, NoLiveInstanceError, WorkerError
from lorafleet.frontend.metrics import FrontendMetrics
from lorafleet.frontend.reachability import Unreachable
from lorafleet.frontend.registry import ServedModel
from lorafleet.frontend.request_plane import RequestPlane
from lorafleet.frontend.router import Router
from lorafleet.frontend.token_stream import Lookup, TokenStream
from lorafleet.process.settings import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Settings, setting
from lorafleet.proto.discovery import Instance
from lorafleet.proto.errors import LorafleetError, error_from_info
from lorafleet.proto.inference import (
    ErrorChunk,
    FinalChunk,
    GenerateRequest,
    StreamChunk,
    TokenChunk,
    TokenLogprob,
    decode_chunk,
)

__all__ = [
    "Completion",
    "DispatchSettings",
    "Dispatcher",
]

log = structlog.get_logger(__name__)

FAILOVER_PAUSE_S: Final = 0.25
"""Wait before re-trying an instance nobody answered for, when no other is left: a worker
whose NATS node died is back on another node within tens of milliseconds."""


@dataclass(frozen=True, kw_only=True)
class DispatchSettings(Settings):
    """How patient the dispatcher is; the frontend's flags for it are declared here.

    Examples::

        DispatchSettings()                               # defaults
        DispatchSettings(stall_s=5.0, max_attempts=2)    # slow engines, fewer retries
        DispatchSettings(migration_limit=0)              # streams never change instance
    """

    stall_s: Annotated[float, POSITIVE] = setting(
        1.0, flag="--stall-timeout-s", env="DYN_STALL_TIMEOUT_S",
        help="seconds of silence from a worker after which the frontend pings it",
    )  # fmt: skip
    ping_timeout_s: Annotated[float, POSITIVE] = 2.0
    max_attempts: Annotated[int, AT_LEAST_ONE] = setting(
        3, flag="--max-attempts", env="DYN_MAX_ATTEMPTS",
        help="how many instances are tried per request",
    )  # fmt: skip
    quarantine_s: Annotated[float, NON_NEGATIVE] = 5.0
    """The least time an instance that was lost gets no new requests (unless no other is
    left); after it, the instance is back once it answers a ping (``reachability``)."""
    migration_limit: Annotated[int, NON_NEGATIVE] = setting(
        3, flag="--migration-limit", env="DYN_MIGRATION_LIMIT",
        help="how many times one stream may continue on another instance when its own is "
        "lost; 0: never",
    )  # fmt: skip


@dataclass(kw_only=True)
class Completion:
    """A whole answer: text, why it ended, token counts, and when the first token came."""

    text: str
    final: FinalChunk
    instance: Instance
    first_token_at: float | None = None
    """``time.perf_counter()`` when the first token arrived, if any did."""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """One per token when the request asked for log probabilities."""


@dataclass(slots=True)
class _Tries:
    """One request's tries: the instances tried, those forgiven a NATS fail-over (tried
    once more), and the last retryable error."""

    served: ServedModel
    tried: list[int] = field(default_factory=list)
    forgiven: set[int] = field(default_factory=set)
    last: LorafleetError | None = None

    def exhausted(self) -> LorafleetError:
        """The error to answer with once no instance is left: the worker's, if one gave one,
        else 503 saying why the last instance tried was lost."""
        if isinstance(self.last, WorkerError):
            return self.last
        why = self.last.message if self.last is not None else ""
        return NoLiveInstanceError(self.served.name, self.tried, why)


class Dispatcher:
    """Routes generate requests to instances and reads their answers, with retries; the
    ``Attempts`` its streams continue through."""

    def __init__(
        self,
        plane: RequestPlane,
        router: Router,
        settings: DispatchSettings | None = None,
        metrics: FrontendMetrics | None = None,
        unreachable: Unreachable | None = None,
    ) -> None:
        self.plane = plane
        self.router = router
        self.settings = settings or DispatchSettings()
        self.metrics = metrics or FrontendMetrics()
        if unreachable is None:  # not ``or``: an empty one is falsy
            unreachable = Unreachable(plane, self.settings)
        self.unreachable = unreachable

    @property
    def migration_limit(self) -> int:
        """How often one stream may continue on another instance (``DYN_MIGRATION_LIMIT``)."""
        return self.settings.migration_limit

    async def complete(self, served: ServedModel, request: GenerateRequest) -> Completion:
        """Run ``request`` to its final chunk, retrying on other instances until then."""
        tries = _Tries(served)
        while len(tries.tried) < self.settings.max_attempts:
            attempt = await self._start(tries, request)
            try:
                return await self._collect(attempt)
            except (InstanceLostError, WorkerError) as exc:
                tries.last = self._retryable_or_raise(exc, attempt)
                await self._forgive_failover(exc, tries)
            except BaseException:
                self.cancel(attempt)
                raise
            finally:
                self.release(attempt)
        raise tries.exhausted()

    async def stream(
        self, served: ServedModel, request: GenerateRequest, lookup: Lookup | None = None
    ) -> TokenStream:
        """Start ``request`` as a stream that migrates to another instance if its own is lost.

        ``lookup`` gives the instances serving the model when the stream migrates (they may
        have changed since it started); without it, or when it finds none, ``served``'s.
        """
        attempt, first = await self.first_chunk(served, request)
        return TokenStream(self, served, request, attempt, first, lookup)

    async def first_chunk(
        self, served: ServedModel, request: GenerateRequest
    ) -> tuple[Attempt, StreamChunk]:
        """Start ``request`` and wait for its first chunk, retrying elsewhere until then."""
        tries = _Tries(served)
        while len(tries.tried) < self.settings.max_attempts:
            attempt = await self._start(tries, request)
            try:
                first = await self.next_chunk(attempt)
            except InstanceLostError as exc:
                self.release(attempt)
                tries.last = self._retryable_or_raise(exc, attempt)
                await self._forgive_failover(exc, tries)
                continue
            except BaseException:
                self.release(attempt)
                self.cancel(attempt)
                raise
            if isinstance(first, ErrorChunk):
                error = WorkerError(attempt.instance.instance_id, error_from_info(first.error))
                self.release(attempt)
                tries.last = self._retryable_or_raise(error, attempt)
                continue
            return attempt, first
        raise tries.exhausted()

    async def _start(self, tries: _Tries, request: GenerateRequest) -> Attempt:
        served = tries.served
        instance = None
        if self.unreachable:
            instance = self.router.route(served, request, self._avoid(tries.tried))
        if instance is None:
            instance = self.router.route(served, request, tries.tried)
            if instance is not None and (stalled := self.unreachable.stalled(instance)):
                tries.last = stalled  # its retry would wait a stall and a ping: fail now
                instance = None
        if instance is None:
            raise tries.exhausted()
        tries.tried.append(instance.instance_id)
        tokens = self.router.load_of(request, instance.instance_id)
        self.router.started(instance.instance_id, tokens)
        try:
            reply = await self.plane.open(instance.subject, request)
        except BaseException:
            self.router.finished(instance.instance_id, tokens)
            raise
        return Attempt(instance=instance, reply=reply, request_id=request.request_id, tokens=tokens)

    async def _collect(self, attempt: Attempt) -> Completion:
        parts: list[str] = []
        logprobs: list[TokenLogprob] = []
        first_token_at: float | None = None
        while True:
            chunk = await self.next_chunk(attempt)
            if isinstance(chunk, TokenChunk):
                if first_token_at is None:
                    first_token_at = time.perf_counter()
                parts.append(chunk.text)
                logprobs += chunk.logprobs
            elif isinstance(chunk, FinalChunk):
                if chunk.answer is not None:  # the worker gathered the tokens (``whole``)
                    if first_token_at is None:
                        first_token_at = time.perf_counter() - chunk.since_first_token_s
                    parts.append(chunk.answer.text)
                    logprobs += chunk.answer.logprobs
                return Completion(
                    text="".join(parts), final=chunk, instance=attempt.instance,
                    first_token_at=first_token_at, logprobs=logprobs,
                )  # fmt: skip
            else:
                raise WorkerError(attempt.instance.instance_id, error_from_info(chunk.error))

    async def next_chunk(self, attempt: Attempt) -> StreamChunk:
        """The next chunk of ``attempt``; raises ``InstanceLostError`` if its worker is gone."""
        return await attempt.reply.receive(
            decode_chunk, attempt.instance.instance_id, self.settings,
            request_id=attempt.request_id,
        )  # fmt: skip

    def _avoid(self, tried: list[int]) -> set[int]:
        """Instances tried for this request and those kept out as unreachable."""
        return {*tried, *self.unreachable.avoided()}

    def release(self, attempt: Attempt) -> None:
        """Stop listening to ``attempt`` and count it done at the router (once)."""
        if not attempt.reply.closed:
            attempt.reply.close()
            self.router.finished(attempt.instance.instance_id, attempt.tokens)

    def cancel(self, attempt: Attempt) -> None:
        """Tell ``attempt``'s instance to stop its request; never waits, never raises."""
        self.plane.cancel(attempt.instance.subject, attempt.request_id)

    def _retryable_or_raise(
        self, exc: InstanceLostError | WorkerError, attempt: Attempt
    ) -> LorafleetError:
        if isinstance(exc, WorkerError) and not exc.retryable:
            raise exc
        self.abandon(exc, attempt)
        log.info("retrying on another instance", instance=f"{attempt.instance.instance_id:x}",
                 reason=exc.message)  # fmt: skip
        return exc

    def abandon(self, exc: InstanceLostError | WorkerError, attempt: Attempt) -> None:
        """After losing ``attempt``'s instance: keep it out until it answers a ping, make the
        other requests waiting on it ping it now, and cancel there if it stalled."""
        if isinstance(exc, InstanceLostError):
            if not exc.link_dropped:  # our own link's fault, not the instance's
                self.unreachable.lose(attempt.instance, exc)
                self.plane.wake_all(attempt.instance.subject)
            if exc.stalled:  # it may be alive but wedged: do not let it work for nobody
                self.cancel(attempt)

    async def _forgive_failover(self, exc: LorafleetError, tries: _Tries) -> None:
        """Let an instance lost to a NATS fail-over be tried once more: at once when this
        frontend's own link dropped; when nobody answered its subject (its node may have
        died a moment ago) only after ``FAILOVER_PAUSE_S``, and only if no other fresh
        instance is left. A single-instance model thus survives a NATS node's death."""
        if not isinstance(exc, InstanceLostError) or exc.instance_id in tries.forgiven:
            return
        if not (exc.link_dropped or exc.no_responders):
            return
        tries.forgiven.add(exc.instance_id)
        tries.tried.remove(exc.instance_id)
        if exc.no_responders and not self._fresh_instances(tries):
            await asyncio.sleep(FAILOVER_PAUSE_S)

    def _fresh_instances(self, tries: _Tries) -> list[Instance]:
        avoid = {*self._avoid(tries.tried), *tries.forgiven}
        return [i for i in tries.served.instances if i.instance_id not in avoid]
