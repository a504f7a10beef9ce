"""``GET /v1/models``: every base model and adapter a live instance serves, once each."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from frontend.controllers._responses import MODEL_ERRORS
from frontend.errors import ModelNotFoundError
from frontend.registry import ModelRegistry, ServedModel
from proto.openai import ModelList, ModelObject

__all__ = ["ModelsController", "model_object"]


def model_object(served: ServedModel) -> ModelObject:
    """OpenAI's model entry, with vLLM's ``root``, ``parent`` and ``max_model_len``."""
    return ModelObject(
        id=served.name,
        created=served.created,
        root=served.root,
        parent=served.parent,
        max_model_len=served.card.context_length or None,
    )


class ModelsController(Controller):
    """OpenAI's models resource, built from etcd's cards and instance records."""

    path = "/v1/models"
    tags = ["models"]

    @get("/", operation_id="listModels", summary="List served models")
    async def list_models(self, registry: NamedDependency[ModelRegistry]) -> ModelList:
        """Every served name, sorted; an adapter's ``parent`` is its base model."""
        return ModelList(data=registry.each(model_object))

    @get(
        "/{model_id:path}",
        operation_id="retrieveModel",
        summary="Describe one served model",
        responses=MODEL_ERRORS,
    )
    async def retrieve_model(
        self, model_id: FromPath[str], registry: NamedDependency[ModelRegistry]
    ) -> ModelObject:
        """One served model by name (names may contain ``/``)."""
        name = model_id.lstrip("/")
        served = registry.get(name)
        if served is None:
            raise ModelNotFoundError(name, registry.names())
        return model_object(served)
