"""The engine interface every backend (mocker, hf, vllm) implements, and its configuration.

An engine generates tokens and, if it supports adapters, adds and removes them.
The LoRA bookkeeping (locks, publish, rollback) lives once in
``worker.lora_controller``; an engine supplies only :class:`AdapterBackend`.
"""

from __future__ import annotations

import abc
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, Protocol, TypeAlias, TypeVar

import msgspec
from msgspec import Meta

from lorafleet.process.settings import AT_LEAST_ONE, NON_NEGATIVE, Settings, comma_list, setting
from lorafleet.proto.discovery import ModelDeploymentCard, RuntimeConfig
from lorafleet.proto.inference import FinalChunk, GenerateRequest, TokenChunk
from lorafleet.proto.kv_events import KvCacheSpec, KvEvent
from lorafleet.proto.naming import lora_slug
from lorafleet.worker.base_model_check import BaseModelCheck

__all__ = [
    "AdapterBackend",
    "EngineConfig",
    "EngineRoute",
    "KvEventSink",
    "LLMEngine",
    "ModelEndpoint",
    "parse_engine_options",
]

Body = TypeVar("Body", bound=msgspec.Struct)

KvEventSink: TypeAlias = Callable[[KvEvent], None]
"""Receives an engine's KV block events as its cache changes (the worker's relay,
``worker.kv_relay``); called on the event loop, must not block."""


def parse_engine_options(pairs: list[str]) -> dict[str, Any]:
    """``--engine-option KEY=JSON`` texts as a dict; a value that is not JSON stays text."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--engine-option {pair!r} must look like KEY=JSON")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


@dataclass(frozen=True)
class EngineRoute(Generic[Body]):
    """A control or update: a typed handler and the Struct its JSON body decodes into.

    The engine registry decodes the body (HTTP or NATS) into ``body_type``, calls
    ``handler`` and encodes its Struct; the handler never sees a dict. Example::

        EngineRoute(UnloadLoraRequest, controller.unload)
    """

    body_type: type[Body]
    handler: Callable[[Body], Awaitable[msgspec.Struct]]


@dataclass(frozen=True, kw_only=True)
class EngineConfig(Settings):
    """What every engine is built from, validated once; the worker's engine flags.

    Examples::

        EngineConfig(model="demo")                                    # mocker, no adapters
        EngineConfig(model="/models/demo", enable_lora=True, max_loras=4)
        EngineConfig(model="demo", served_model_name="chat", options={"time_per_token_s": 0.01})
    """

    model: Annotated[str, Meta(min_length=1)] = setting(
        flag="--model", env="DYN_MODEL", help="the model's path or name",
    )  # fmt: skip
    served_model_name: str | None = setting(
        None, flag="--served-model-name", env="DYN_SERVED_MODEL_NAME",
        help="the name clients put in model; default: --model",
    )  # fmt: skip
    enable_lora: bool = setting(
        False, flag="--enable-lora", env="DYN_ENABLE_LORA",
        help="serve LoRA adapters; LoRA management also needs DYN_LORA_ENABLED=true in the "
        "environment",
    )  # fmt: skip
    max_loras: Annotated[int, AT_LEAST_ONE] = setting(
        4, flag="--max-loras", env="DYN_MAX_LORAS", help="adapter slots: adapters loaded at once",
        more="A full worker evicts the idle, unpinned adapter the fleet asks least for (least "
        "recently used breaks ties), never the last warm copy of one in use "
        "([`docs/fleet.md`](docs/fleet.md)).",
    )  # fmt: skip
    max_lora_rank: Annotated[int, AT_LEAST_ONE] = setting(
        64, flag="--max-lora-rank", env="DYN_MAX_LORA_RANK",
        help="the largest adapter rank accepted",
    )  # fmt: skip
    base_model_check: BaseModelCheck = setting(
        BaseModelCheck.WARN, flag="--lora-base-model-check", env="DYN_LORA_BASE_MODEL_CHECK",
        help="an adapter trained for another base model: strict refuses it (400), warn loads it "
        "with a warning in the answer, off does not compare",
        more="The adapter's `base_model_name_or_path` is compared with the served name, the "
        "model path, the hub id in the model's `config.json` and the aliases, exactly or by "
        "last path segment ignoring case ([`docs/lora-manager.md`](docs/lora-manager.md)).",
    )  # fmt: skip
    base_model_aliases: tuple[str, ...] = setting(
        (), flag="--lora-base-model-aliases", env="DYN_LORA_BASE_MODEL_ALIASES",
        parse=comma_list, metavar="NAMES",
        help="more names of the base model that adapters may name, comma-separated",
    )  # fmt: skip
    lora_drain_timeout_s: Annotated[float, NON_NEGATIVE] = setting(
        30.0, flag="--lora-drain-timeout-s", env="DYN_LORA_DRAIN_TIMEOUT_S",
        help="seconds an adapter version that leaves the engine (a swap's old version, an "
        "unload, an eviction) lets its running requests finish; the rest end with an error",
        more="New requests stop reaching it first; an unload answers once it is gone "
        "([`docs/versions.md`](docs/versions.md)).",
    )  # fmt: skip
    context_length: int = setting(
        2048, flag="--context-length", env="DYN_CONTEXT_LENGTH",
        help="tokens of prompt plus output",
    )  # fmt: skip
    mocker_time_per_token_s: Annotated[float, NON_NEGATIVE] = setting(
        0.0, flag="--mocker-time-per-token-s", env="DYN_MOCKER_TIME_PER_TOKEN_S",
        help="mocker: seconds per token; an engine option time_per_token_s wins",
    )  # fmt: skip
    options: Mapping[str, Any] = setting(
        factory=dict, flag="--engine-option", many=True, parse=parse_engine_options,
        metavar="KEY=JSON",
        help="engine-specific option KEY=JSON, e.g. fail_add_adapter='\"broken.*\"' (repeatable)",
        more="mocker: `fail_add_adapter`, `fail_remove_adapter`, `fail_generate` (a regex of "
        "model names whose requests fail) with `fail_generate_share` (which share, spread "
        "evenly; default 1), `add_adapter_delay_s`, `endpoint_ready_delay_s`, "
        "`fail_on_endpoint_ready`, `output_tokens`, `max_running` (requests generated at once; "
        "others queue), `name_version` (tokens name the adapter "
        "version), `block_size` (16), `kv_cache_blocks` (2048; 0: no KV cache), "
        "`prefill_time_per_token_s` (0.0001 per uncached prompt token; "
        "[`docs/worker.md`](docs/worker.md)). hf: "
        "`max_batch_size`, `device`, `dtype`, `cpu_threads`. vllm: vLLM's engine arguments "
        "([`docs/vllm_engine.md`](docs/vllm_engine.md)).",
    )  # fmt: skip

    @property
    def model_name(self) -> str:
        """The name clients put in ``model`` for the base model."""
        return self.served_model_name or self.model


class ModelEndpoint(Protocol):
    """What an engine receives in ``on_endpoint_ready``: publishing its own cards."""

    @property
    def instance_id(self) -> int:
        """The worker's lease id, which names it in etcd and on NATS."""
        ...

    @property
    def inflight(self) -> int:
        """Generate requests this worker is serving now, base model and adapters."""
        ...

    async def register_model(self, card: ModelDeploymentCard) -> None:
        """Put ``card`` in etcd under the worker's lease (raises ``UnavailableError``)."""
        ...

    async def unregister_model(self, card: ModelDeploymentCard) -> None:
        """Delete ``card`` from etcd (raises ``UnavailableError``)."""
        ...


class AdapterBackend(Protocol):
    """The only adapter work an engine does itself: add and remove weights."""

    async def add_adapter(self, name: str, lora_id: int, path: Path) -> None:
        """Make adapter ``name`` usable by ``generate``; raise a LorafleetError on failure."""
        ...

    async def remove_adapter(self, name: str) -> None:
        """Stop serving adapter ``name`` and free its slot."""
        ...


class LLMEngine(abc.ABC):
    """A backend that generates text for a base model and, optionally, its adapters."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    async def start(self) -> None:  # noqa: B027
        """Load weights and warm up; called once before anything else."""

    @abc.abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | FinalChunk]:
        """Stream tokens for ``request``, ending with a ``FinalChunk``.

        Raises a LorafleetError for a model name it does not serve. Cancelling
        the consuming task must stop the work for this request.
        """

    def base_card(self) -> ModelDeploymentCard:
        """The card of the base model this engine serves."""
        config = self.config
        return ModelDeploymentCard(
            display_name=config.model_name,
            slug=lora_slug(config.model_name),
            source_path=config.model,
            context_length=config.context_length,
            runtime_config=RuntimeConfig(
                max_loras=config.max_loras,
                max_lora_rank=config.max_lora_rank,
                enable_lora=config.enable_lora,
            ),
            created=int(time.time()),
        )

    def track_request(self, model: str) -> contextlib.AbstractContextManager[None]:
        """Held while a request for ``model`` runs (adapter engines count usage for LRU)."""
        return contextlib.nullcontext()

    def kv_cache_spec(self) -> KvCacheSpec | None:
        """The engine's prefix cache as routers need it (on the ``Instance`` record); None:
        it reports none, and routers remember where they sent prefixes instead."""
        return None

    def publish_kv_events(self, sink: KvEventSink) -> None:  # noqa: B027
        """Send block events to ``sink`` from now on (engines whose ``kv_cache_spec`` says
        ``events``); called once, before ``start``."""

    def supported_controls(self) -> dict[str, EngineRoute[Any]]:
        """Controls served under ``/engine/control/<name>``; none by default."""
        return {}

    def supported_updates(self) -> dict[str, EngineRoute[Any]]:
        """Updates served under ``/engine/update/<name>``; none by default."""
        return {}

    async def on_endpoint_ready(self, endpoint: ModelEndpoint) -> None:  # noqa: B027
        """Keep ``endpoint`` to publish and retract cards; called exactly once."""

    async def stop(self) -> None:  # noqa: B027
        """Release weights and background tasks."""
