"""The hf engine: transformers + peft generation with every request, base or adapter, in one batch.

One model thread owns the model and a ``DecodeBatch``: it steps the batch for
as long as requests wait or run, and between steps runs the jobs the event
loop hands it (model load, adapter add and remove). It never waits for the
event loop: each step's tokens join a queue the loop drains, and the next step
starts at once. It wakes the loop (``call_soon_threadsafe``) for a row's first
or last token, before it sleeps, and otherwise at most every
``WAKE_INTERVAL_S``: on a small model a wake per step cost a sixth of the model
thread's time (the self-pipe write hands the GIL to the loop). Between wakes
the tokens of a few steps wait; each still reaches the client in a chunk of its
own. A row ends on the model thread at eos or its budget, and
on the loop at a stop string or cancel (the model thread drops it at its next
step, so such a row may compute a token nobody reads). A round trip through
the event loop per step cost the engine a third of its speed on a busy machine.

LoRA bookkeeping (locks, cards, rollback, eviction) is not done here but in
``worker.lora_controller`` (through ``AdapterEngine``), which calls
:meth:`HFEngine.add_adapter` and :meth:`HFEngine.remove_adapter`.
"""

from __future__ import annotations

import asyncio
import enum
import queue
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final, TypeVar

import msgspec
import structlog

from lorafleet.fleet.adapter_files import check_adapter_rank
from lorafleet.proto.discovery import ModelDeploymentCard
from lorafleet.proto.errors import (
    InvalidRequestError,
    LorafleetError,
    UnavailableError,
    UpstreamError,
)
from lorafleet.proto.inference import FinalChunk, GenerateRequest, TokenChunk
from lorafleet.worker import metrics
from lorafleet.worker.adapter_engine import AdapterEngine
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines._hf_adapters import Adapter
from lorafleet.worker.engines._hf_batch import BASE_ADAPTER, DecodeBatch, Row, RowState
from lorafleet.worker.engines._hf_model import ModelHost
from lorafleet.worker.engines._hf_request import InFlight, check_sampling, prompt_ids
from lorafleet.worker.engines._hf_text import TextStream

__all__ = ["EngineState", "HFEngine"]

log = structlog.get_logger(__name__)

DEFAULT_MAX_BATCH_SIZE: Final = 16
WAKE_INTERVAL_S: Final = 0.005
"""How long after a wake the next one may come: a token waits at most this and one step."""
_T = TypeVar("_T")
Job = Callable[[], None]


class EngineState(enum.Enum):
    """Lifecycle of an engine: built, serving, stopped."""

    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class HFEngine(AdapterEngine):
    """transformers + peft engine; batches base and adapter requests together (mixed LoRA).

    ``config.options``: ``device`` ("auto", "cpu", "cuda"), ``dtype`` ("auto" is float32
    on CPU, the checkpoint's dtype on GPU), ``max_batch_size`` (rows per step, default 16),
    ``cpu_threads`` (torch threads on CPU, default 1: right for small models).
    """

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.max_batch_size = int(config.options.get("max_batch_size", DEFAULT_MAX_BATCH_SIZE))
        self.state = EngineState.NEW
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        """Work for the model thread between steps; None ends it."""
        self._thread: threading.Thread | None = None
        self._host: ModelHost | None = None
        self._batch: DecodeBatch | None = None
        self._waiting: deque[InFlight] = deque()
        """Appended by the event loop, taken by the model thread."""
        self._running: list[InFlight] = []
        """The batch's rows in order: replaced, never changed in place, by the model thread."""
        self._stepped: deque[tuple[list[tuple[InFlight, int]], frozenset[int]]] = deque()
        """Each step's (request, token) pairs and the eos ids, until the event loop reads them."""
        self._drain_due = False
        """Whether a :meth:`_drain` is scheduled on the event loop and has not started."""
        self._woken_at = 0.0
        """When the model thread last scheduled a :meth:`_drain` (``time.monotonic``)."""
        self._wake_due = False
        """Whether a :meth:`_wake_model` is scheduled on the event loop and has not run."""
        self._adapters: dict[str, Adapter] = {}
        self._peak_batch = 0
        self._tokens_total = 0

    async def _on_model_thread(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the one thread that touches the model, between two steps."""
        if self.state is EngineState.STOPPED:  # its thread ran its last job, or soon will
            raise UnavailableError(f"hf engine for {self.config.model_name} stopped")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()

        def job() -> None:
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting coroutine
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

        self._jobs.put(job)
        return await future

    async def start(self) -> None:
        """Load tokenizer and weights on the model thread, then start the generation loop."""
        started = time.monotonic()
        device = str(self.config.options.get("device", "auto"))
        dtype = str(self.config.options.get("dtype", "auto"))
        threads = int(self.config.options.get("cpu_threads", 1))
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._serve, args=(loop,), name="hf-model", daemon=True
        )
        self._thread.start()
        host = await self._on_model_thread(
            lambda: ModelHost(self.config.model, device=device, dtype=dtype, cpu_threads=threads)
        )
        self._host, self._batch = host, DecodeBatch(host.device, host.pad_id, host.eos_ids)
        self.state = EngineState.RUNNING
        log.info(
            "hf.started",
            model=self.config.model,
            device=str(host.device),
            load_s=round(time.monotonic() - started, 3),
        )

    async def stop(self) -> None:
        """Fail what is in flight, stop the loop, release the model thread and weights."""
        self.state = EngineState.STOPPED
        if self._thread is not None:
            self._jobs.put(None)
            await asyncio.to_thread(self._thread.join)
        self._fail_all(UnavailableError(f"hf engine for {self.config.model_name} stopped"))
        self._host = self._batch = None

    def stats(self) -> dict[str, int]:
        """Rows waiting and running now, the largest batch so far, tokens generated so far."""
        return {
            "waiting": len(self._waiting),
            "running": sum(not r.row.spent for r in self._running),
            "peak_batch": self._peak_batch,
            "tokens_generated": self._tokens_total,
        }

    @property
    def context_length(self) -> int:
        """Tokens a request may span: the flag, capped at the model's own limit once loaded."""
        limit = self._host.max_positions if self._host is not None else 0
        return min(self.config.context_length, limit or self.config.context_length)

    def base_card(self) -> ModelDeploymentCard:
        """The base card, with the context length this engine accepts (known once started)."""
        return msgspec.structs.replace(super().base_card(), context_length=self.context_length)

    def loaded_adapters(self) -> dict[str, int]:
        """Adapters usable now, by name, with their ``lora_id``."""
        return {a.name: a.lora_id for a in self._adapters.values()}

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | FinalChunk]:
        """Stream ``request``'s tokens; leaving the stream early frees its batch row."""
        pending = self._admit(request)
        try:
            while True:
                outcome = await pending.outbox.get()
                if isinstance(outcome, LorafleetError):
                    raise outcome
                yield outcome
                if isinstance(outcome, FinalChunk):
                    return
        finally:
            if not pending.done:
                pending.row.state = RowState.DONE  # the model thread drops its row next step

    def _admit(self, request: GenerateRequest) -> InFlight:
        """Validate and queue ``request``; raise before any work for what cannot be served."""
        if self.state is not EngineState.RUNNING or self._host is None:
            raise UnavailableError(f"hf engine for {self.config.model_name} is not running")
        adapter = self.resolve(request.model, self._adapters)
        prompt = prompt_ids(self._host.tokenizer, request)
        ids = prompt + request.generated_ids  # a continuation resumes after its tokens
        context = self.context_length
        sampling = request.sampling
        budget = min(sampling.max_tokens, context - len(ids))
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(63)
        row = Row(prompt_ids=ids, params=sampling, budget=budget, rng=random.Random(seed))
        row.adapter = adapter.key if adapter else BASE_ADAPTER
        pending = InFlight(
            request_id=request.request_id,
            model=request.model,
            row=row,
            text=TextStream(self._host.tokenizer, sampling.stop, request.generated_ids),
            max_new_tokens=budget,
            prompt_tokens=len(prompt),
            tokenizer=self._host.tokenizer,
        )
        if request.generated_ids and budget <= 0:
            pending.end_exhausted()
            return pending
        if len(ids) >= context:
            raise InvalidRequestError(
                f"request {request.request_id}: prompt of {len(ids)} tokens leaves no room "
                f"in the context of {context} tokens"
            )
        check_sampling(request.request_id, sampling, self._host.vocab_size)
        self._waiting.append(pending)
        if not self._wake_due:  # once per loop iteration: requests sent together start together
            self._wake_due = True
            asyncio.get_running_loop().call_soon(self._wake_model)
        return pending

    def _wake_model(self) -> None:
        """Wake the model thread if it sleeps: it takes every request that waits by now.

        Woken at the first of them, it would prefill that one alone and the rest a step
        later, left-padded: every step after that pays for a full attention mask.
        """
        self._wake_due = False
        self._jobs.put(_nothing)

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """The model thread: run jobs as they come; step while requests wait or run."""
        while True:
            if (self._waiting or self._running) and self._jobs.empty():
                self._step(loop)
                continue
            if self._stepped:
                self._wake_loop(loop)  # no token waits while this thread sleeps or runs a job
            job = self._jobs.get()
            if job is None:
                return
            job()

    def _step(self, loop: asyncio.AbstractEventLoop) -> None:
        """One batch step; its tokens go to the event loop, a failure fails every request."""
        try:
            tokens = self._step_batch()
        except Exception as exc:  # e.g. a torch failure: fail this batch, keep serving
            log.exception("hf.step_failed", rows=len(self._running))
            failed = [*self._running, *_take_all(self._waiting)]
            self._running = []
            assert self._batch is not None
            self._batch.reset()
            error = UpstreamError(f"hf engine step failed: {exc}")
            loop.call_soon_threadsafe(_fail, failed, error)
            return
        assert self._host is not None
        self._stepped.append((list(zip(self._running, tokens, strict=True)), self._host.eos_ids))
        due = time.monotonic() - self._woken_at >= WAKE_INTERVAL_S
        if due or any(r.row.finished or len(r.row.output_ids) == 1 for r in self._running):
            self._wake_loop(loop)

    def _wake_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have the event loop drain the stepped tokens, unless a drain is due already."""
        if not self._drain_due:  # else the loop has not yet run the drain it was handed
            self._drain_due = True
            self._woken_at = time.monotonic()
            loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        """On the event loop: hand each request its tokens of every step not yet read."""
        self._drain_due = False  # first: a step appended from now on schedules a new drain
        while self._stepped:
            tokens, eos_ids = self._stepped.popleft()
            for request, token in tokens:
                request.deliver(token, eos_ids)

    def _step_batch(self) -> list[int]:
        """Drop spent rows, admit waiting ones, step: one new token per running row."""
        host, batch = self._host, self._batch
        assert host is not None and batch is not None
        dropped = [r.row for r in self._running if r.row.spent]
        self._running = [r for r in self._running if not r.row.spent]
        admit: list[InFlight] = []
        while self._waiting and len(self._running) + len(admit) < self.max_batch_size:
            if not (request := self._waiting.popleft()).row.spent:
                admit.append(request)
                self._observe_queue_time(request)
        self._running = [*self._running, *admit]  # kept rows, then admitted ones
        tokens = batch.step(host.forward, [r.row for r in admit], dropped)
        self._peak_batch = max(self._peak_batch, len(tokens))
        self._tokens_total += len(tokens)
        return tokens

    def _observe_queue_time(self, request: InFlight) -> None:
        base = self.config.model_name
        adapter = "" if request.model == base else request.model
        waited_s = time.perf_counter() - request.queued_at
        metrics.QUEUE_SECONDS.labels(base, adapter).observe(waited_s)

    def _fail_all(self, error: LorafleetError) -> None:
        """End every waiting and running request with ``error`` (the model thread has ended)."""
        _fail([*_take_all(self._waiting), *self._running], error)
        self._running = []

    async def add_adapter(self, name: str, lora_id: int, path: Path) -> None:
        """Load the peft adapter at ``path`` as ``name``."""
        if self.state is not EngineState.RUNNING or self._host is None:
            raise UnavailableError(f"adapter {name!r}: hf engine is not running")
        if not self.config.enable_lora:
            raise InvalidRequestError(f"adapter {name!r}: LoRA is not enabled on this engine")
        adapter = Adapter(name=name, lora_id=lora_id, path=path)
        started, host, max_rank = time.monotonic(), self._host, self.config.max_lora_rank
        await self._on_model_thread(lambda: _load_adapter(host, adapter, max_rank))
        self._adapters[name] = adapter
        log.info(
            "hf.adapter.added",
            adapter=name,
            lora_id=lora_id,
            path=str(path),
            load_s=round(time.monotonic() - started, 3),
        )

    async def remove_adapter(self, name: str) -> None:
        """Unload adapter ``name`` at once; its requests still in flight (the controller
        drained it first) end with ``unloaded_error``."""
        adapter = self._adapters.pop(name)  # admits no new request for it from here on
        host, batch = self._host, self._batch
        assert host is not None and batch is not None

        def drop_its_rows() -> list[InFlight]:
            """On the model thread, where no request is between waiting and running."""
            victims = [r for r in [*self._waiting, *self._running] if r.row.adapter == adapter.key]
            for request in victims:
                request.row.finished = True  # never admitted or stepped again
            batch.drop([r.row for r in victims])
            return victims

        for request in await self._on_model_thread(drop_its_rows):
            request.fail(self.unloaded_error(name, request.request_id))

        try:
            await self._on_model_thread(lambda: host.remove_adapter(adapter.key))
        except Exception as exc:
            self._adapters[name] = adapter
            raise UpstreamError(f"adapter {name!r}: removing it failed: {exc}") from exc
        log.info("hf.adapter.removed", adapter=name, lora_id=adapter.lora_id)


def _nothing() -> None:
    """A job that only wakes the model thread."""


def _take_all(waiting: deque[InFlight]) -> list[InFlight]:
    """Empty ``waiting`` one by one: safe while the other thread appends to it."""
    taken = []
    while waiting:
        taken.append(waiting.popleft())
    return taken


def _fail(requests: list[InFlight], error: LorafleetError) -> None:
    """On the event loop: end each of ``requests`` with ``error``."""
    for request in requests:
        request.fail(error)


def _settle(future: asyncio.Future[_T], result: _T | None, error: BaseException | None) -> None:
    """On the event loop: pass a model thread job's outcome to its awaiting coroutine."""
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]


def _load_adapter(host: ModelHost, adapter: Adapter, max_rank: int) -> None:
    """On the model thread: check the files, then load into peft (undone on failure)."""
    check_adapter_rank(adapter.name, adapter.path, max_rank)
    try:
        host.add_adapter(adapter.key, adapter.path)
    except Exception as exc:
        host.discard_partial(adapter.key)
        raise InvalidRequestError(
            f"adapter {adapter.name!r}: cannot load {adapter.path}: {exc}"
        ) from exc
