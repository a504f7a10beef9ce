"""Base class of engines that serve adapters: wires the shared LoRA lifecycle to add/remove.

An engine subclasses this and implements ``add_adapter``/``remove_adapter``;
locking, publishing and rollback stay in ``LoraController``. The controller is
created in ``on_endpoint_ready``, so no update can run before the engine
holds its endpoint.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from lorafleet.proto.discovery import ModelDeploymentCard
from lorafleet.proto.errors import NotFoundError, UnavailableError
from lorafleet.worker.base_model_check import BaseModelPolicy, hub_id
from lorafleet.worker.engine import EngineRoute, LLMEngine, ModelEndpoint
from lorafleet.worker.lora_controller import AdapterSource, LoraController

__all__ = ["AdapterEngine"]

Handle = TypeVar("Handle")


class AdapterEngine(LLMEngine):
    """An engine with a LoRA lifecycle once ``enable_adapters`` was called before start-up."""

    lora: LoraController | None = None
    _adapter_source: AdapterSource | None = None

    def enable_adapters(self, source: AdapterSource) -> None:
        """Turn LoRA management on, resolving URIs through ``source``."""
        self._adapter_source = source

    async def on_endpoint_ready(self, endpoint: ModelEndpoint) -> None:
        """Create the LoRA lifecycle bound to ``endpoint`` (when adapters are enabled)."""
        if self._adapter_source is not None:
            self.lora = LoraController(
                backend=self,
                endpoint=endpoint,
                source=self._adapter_source,
                base_card=self.base_card(),
                base_check=self.base_model_policy(),
                drain_timeout_s=self.config.lora_drain_timeout_s,
            )

    def base_model_policy(self) -> BaseModelPolicy:
        """How loads compare an adapter's base model with this engine's names."""
        config = self.config
        names = (config.model_name, config.model, hub_id(config.model), *config.base_model_aliases)
        return BaseModelPolicy.of(config.base_model_check, names)

    def base_card(self) -> ModelDeploymentCard:
        """The base card; ``runtime_config.enable_lora`` says whether adapters load here."""
        card = super().base_card()
        runtime = msgspec.structs.replace(
            card.runtime_config, enable_lora=self._adapter_source is not None
        )
        return msgspec.structs.replace(card, runtime_config=runtime)

    def supported_updates(self) -> dict[str, EngineRoute[Any]]:
        """``load_lora``, ``unload_lora`` and ``list_loras`` when adapters are enabled."""
        return self.lora.routes() if self.lora is not None else {}

    def track_request(self, model: str) -> contextlib.AbstractContextManager[None]:
        """Count ``model`` as busy and recently used while its request runs."""
        return self.lora.track(model) if self.lora is not None else contextlib.nullcontext()

    def resolve(self, model: str, handles: Mapping[str, Handle]) -> Handle | None:
        """The engine's handle of the version serving the adapter ``model`` names now (by its
        key, ``name@digest``), None for the base model; ``NotFoundError`` for anything else.
        Called in the same step as ``track_request``, so both see the same version."""
        if model == self.config.model_name:
            return None
        key = self.lora.engine_key(model) if self.lora is not None else model  # bare: by name
        handle = handles.get(key) if key is not None else None
        if handle is None:
            loaded = self.lora.loaded if self.lora is not None else sorted(handles)
            raise NotFoundError(
                f"model {model!r} is not served here; base model {self.config.model_name!r}, "
                f"adapters loaded: {loaded}"
            )
        return handle

    def kv_version(self, key: str) -> str:
        """The version the KV blocks of engine key ``key`` belong to: the adapter's name and
        full digest, as its card says (``fleet.kv_blocks.version_key``), so frontends key
        them as the card does; the key itself without LoRA management."""
        return self.lora.kv_version(key) if self.lora is not None else key

    @abc.abstractmethod
    async def add_adapter(self, name: str, lora_id: int, path: Path) -> None:
        """Make the adapter version keyed ``name`` (``adapter@digest``) usable by ``generate``;
        raise a LorafleetError on failure.

        The controller has checked the name, the id and the slot; it never adds a
        key twice without removing it in between. Two versions of one adapter may be
        held at once during a swap.
        """

    @abc.abstractmethod
    async def remove_adapter(self, name: str) -> None:
        """Stop serving the version keyed ``name`` (which the controller knows is loaded) at
        once, ending each request still running on it with :meth:`unloaded_error`.

        The controller has drained it first (``VersionSteps.drain_and_remove``): an engine
        never waits for its requests itself.
        """

    def unloaded_error(self, key: str, request_id: str) -> UnavailableError:
        """The one error every engine ends a request with when the adapter version it runs
        on (engine key ``key``) is removed under it: it outlasted the drain."""
        name = key.partition("@")[0]
        return UnavailableError(
            f"adapter {name!r} was unloaded while request {request_id} was running: the "
            f"request outlasted the {self.config.lora_drain_timeout_s:g} s its running requests "
            "get to finish (DYN_LORA_DRAIN_TIMEOUT_S); send it again",
            lora_name=name,
        )
