"""The engine interface every backend (mocker, hf, vllm) implements, and its configuration.

An engine generates tokens and, if it supports adapters, adds and removes them.
The LoRA bookkeeping (locks, publish, rollback) lives once in
``worker.lora_controller``; an engine supplies only :class:`AdapterBackend`.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from lorafleet.proto.discovery import ModelDeploymentCard, RuntimeConfig
from lorafleet.proto.inference import FinalChunk, GenerateRequest, TokenChunk
from lorafleet.proto.naming import lora_slug

__all__ = [
    "AdapterBackend",
    "EngineConfig",
    "EngineRoute",
    "LLMEngine",
    "ModelEndpoint",
]

Body = TypeVar("Body", bound=msgspec.Struct)


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
class EngineConfig:
    """What every engine is built from, validated once.

    Examples::

        EngineConfig(model="demo")                                    # mocker, no adapters
        EngineConfig(model="/models/demo", enable_lora=True, max_loras=4)
        EngineConfig(model="demo", served_model_name="chat", options={"time_per_token_s": 0.01})
    """

    model: str
    served_model_name: str | None = None
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 64
    context_length: int = 2048
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a non-empty path or name")
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be at least 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be at least 1, got {self.max_lora_rank}")

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
