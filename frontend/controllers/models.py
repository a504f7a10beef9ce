"""``GET /v1/models``: every base model and adapter a live instance serves, and cold adapters.

A cold adapter (desired, loaded nowhere, base model served) is listed with
``loaded: false`` and lorafleet's ``status`` (``AdapterStates``): the first request
for it loads it on demand, unless its last load failed (``status.state`` is
``failed``, with the error).
"""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from frontend.adapter_states import AdapterStates
from frontend.controllers._responses import MODEL_ERRORS
from frontend.errors import ModelNotFoundError
from frontend.registry import ServedModel
from frontend.resolver import ColdAdapter
from frontend.services import Services
from proto.openai import ModelList, ModelObject, ModelStatus
from proto.uris import public_uri

__all__ = ["ModelsController", "cold_model_object", "model_object"]


def model_object(served: ServedModel) -> ModelObject:
    """OpenAI's model entry, with vLLM's ``root`` (no local path), ``parent`` and
    ``max_model_len``."""
    return ModelObject(
        id=served.name,
        created=served.created,
        root=served.root,
        parent=served.parent,
        max_model_len=served.card.context_length or None,
    )


def cold_model_object(cold: ColdAdapter, states: AdapterStates) -> ModelObject:
    """The entry of a cold adapter: ``loaded: false``, its state (and error when it failed),
    its base's ``created`` and length."""
    now = states.state_of(cold.spec)
    return ModelObject(
        id=cold.spec.name,
        created=cold.base.created,
        root=public_uri(cold.spec.source.uri),
        parent=cold.spec.base_model,
        max_model_len=cold.base.card.context_length or None,
        loaded=False,
        status=ModelStatus(state=now.state, error=now.error),
    )


class ModelsController(Controller):
    """OpenAI's models resource, built from etcd's cards, instances and desired adapters."""

    path = "/v1/models"
    tags = ["models"]

    @get("/", operation_id="listModels", summary="List served models")
    async def list_models(self, services: NamedDependency[Services]) -> ModelList:
        """Every served name and cold adapter, sorted; an adapter's ``parent`` is its base."""
        resolver = services.resolver
        entries = resolver.registry.each(model_object)  # sorted; rebuilt only where changed
        cold = resolver.cold()
        if cold:
            entries += [cold_model_object(adapter, services.adapters) for adapter in cold]
            entries.sort(key=lambda entry: entry.id)
        return ModelList(data=entries)

    @get(
        "/{model_id:path}",
        operation_id="retrieveModel",
        summary="Describe one served model",
        responses=MODEL_ERRORS,
    )
    async def retrieve_model(
        self, model_id: FromPath[str], services: NamedDependency[Services]
    ) -> ModelObject:
        """One served model or cold adapter by name (names may contain ``/``)."""
        name = model_id.lstrip("/")
        served = services.resolver.registry.get(name)
        if served is not None:
            return model_object(served)
        for cold in services.resolver.cold():
            if cold.spec.name == name:
                return cold_model_object(cold, services.adapters)
        raise ModelNotFoundError(name, services.resolver.names())
