"""vLLM's ``GET /v1/models`` on the worker's status server: the base model and its adapters.

In vLLM's shape (``object: "list"``, one ``model`` entry per name, adapters with the base
as ``parent``), so clients that drive a vLLM server's LoRA routes (the Gateway API
Inference Extension's LoRA syncer) can read what this worker holds. Reads the engine
through its public methods; holds no LoRA logic. Never shows a path: ``root`` is a name.
"""

from __future__ import annotations

from litestar import get
from litestar.handlers import HTTPRouteHandler

from lorafleet.proto.openai import ModelList, ModelObject
from lorafleet.worker.adapter_engine import AdapterEngine
from lorafleet.worker.engine import LLMEngine

__all__ = ["models_route", "worker_models"]

OWNED_BY = "vllm"
"""What vLLM answers in ``owned_by``; clients that match on it see a vLLM server."""


def worker_models(engine: LLMEngine) -> ModelList:
    """The base model (with the context it serves) and every adapter loaded here now."""
    card = engine.base_card()
    base = ModelObject(
        id=card.display_name, created=card.created, owned_by=OWNED_BY,
        root=card.display_name, max_model_len=card.context_length or None,
    )  # fmt: skip
    controller = engine.lora if isinstance(engine, AdapterEngine) else None
    names = controller.list().loras if controller is not None else {}
    adapters = [
        ModelObject(id=name, created=card.created, owned_by=OWNED_BY, root=name,
                    parent=card.display_name)
        for name in names
    ]  # fmt: skip
    return ModelList(data=[base, *adapters])


def models_route(engine: LLMEngine) -> HTTPRouteHandler:
    """The ``GET /v1/models`` handler for ``engine``'s worker."""

    @get("/v1/models", sync_to_thread=False)
    def list_models() -> ModelList:
        """The base model and the adapters this worker holds, as vLLM lists them."""
        return worker_models(engine)

    return list_models
