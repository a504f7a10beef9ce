"""``GET /v1/models``: every base model and adapter a live instance serves, and cold adapters.

An alias is listed with its ``targets`` and ``rollout``. A cold adapter (desired,
loaded nowhere, base model served) is listed with ``loaded: false`` and lorafleet's
``status`` (``AdapterStates``): the first request for it loads it on demand, unless its
last load failed (``status.state`` is ``failed``, with the error). Without cold adapters
and aliases the list is sent pre-encoded: each entry is encoded once when its model
changes and the whole body is kept until the next change (``ModelRegistry.joined``), so
a GET of 10,000 entries sends bytes already made instead of building and encoding
10,000 objects.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec
from litestar import Controller, MediaType, Request, Response, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from lorafleet.frontend.adapter_states import AdapterStates
from lorafleet.frontend.controllers._responses import MODEL_ERRORS
from lorafleet.frontend.errors import ModelNotFoundError
from lorafleet.frontend.registry import ModelRegistry, ServedModel
from lorafleet.frontend.resolver import ColdAdapter
from lorafleet.frontend.services import Services
from lorafleet.proto.aliases import Alias, AliasModelObject
from lorafleet.proto.openai import ModelList, ModelObject, ModelStatus
from lorafleet.proto.tenants import Tenant, may_use
from lorafleet.proto.uris import public_uri

__all__ = ["ModelsController", "alias_model_object", "cold_model_object", "model_object"]

_LIST_HEAD, _LIST_TAIL = msgspec.json.encode(ModelList(data=[])).split(b"[]")
_BODY_HEAD, _BODY_TAIL = _LIST_HEAD + b"[", b"]" + _LIST_TAIL
"""A ``ModelList`` body around its entries."""


def model_object(served: ServedModel) -> ModelObject:
    """OpenAI's model entry, with vLLM's ``root`` (no local path), ``parent`` and
    ``max_model_len``, and an adapter's ``digest``: every adapter a live instance serves,
    declared or loaded straight onto a worker."""
    return ModelObject(
        id=served.name,
        created=served.created,
        root=served.root,
        parent=served.parent,
        max_model_len=served.card.context_length or None,
        digest=served.card.digest or None,
    )


def _encoded_model_object(served: ServedModel) -> bytes:
    """``model_object(served)`` as JSON, as the list's body holds it."""
    return msgspec.json.encode(model_object(served))


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


def alias_model_object(alias: Alias, registry: ModelRegistry) -> ModelObject:
    """An alias's entry: its targets and rollout, and its first served target's base model."""
    first = next(filter(None, map(registry.get, (t.model for t in alias.targets))), None)
    return AliasModelObject(
        id=alias.name, created=0 if first is None else first.created,
        parent=None if first is None else first.parent, targets=alias.targets,
        rollout=alias.rollout,
    )  # fmt: skip


class ModelsController(Controller):
    """OpenAI's models resource, built from etcd's cards, instances and desired adapters."""

    path = "/v1/models"
    tags = ["models"]

    @get("/", operation_id="listModels", summary="List served models")
    async def list_models(
        self, request: Request[Any, Any, Any], services: NamedDependency[Services]
    ) -> Response[ModelList]:
        """Every served name and cold adapter, sorted; an adapter's ``parent`` is its base.

        With API keys in use, only the names the caller's tenant may use."""
        tenant = _tenant(request, services)
        resolver = services.resolver
        cold = resolver.cold()
        aliases = services.aliases.records()
        # the usual case: the registry's pre-encoded entries
        if not cold and not aliases and tenant is None:
            body = resolver.registry.joined(_encoded_model_object, head=_BODY_HEAD, tail=_BODY_TAIL)
            # bytes are sent as they are: the body is an encoded ModelList
            return cast("Response[ModelList]", Response(body, media_type=MediaType.JSON))
        entries = resolver.registry.each(model_object)  # sorted; rebuilt only where changed
        entries += [cold_model_object(adapter, services.adapters) for adapter in cold]
        entries += [alias_model_object(alias, resolver.registry) for alias in aliases]
        entries.sort(key=lambda entry: entry.id)
        if tenant is not None:
            entries = [entry for entry in entries if may_use(tenant, entry.id)]
        return Response(ModelList(data=entries))

    @get(
        "/{model_id:path}",
        operation_id="retrieveModel",
        summary="Describe one served model",
        responses=MODEL_ERRORS,
    )
    async def retrieve_model(
        self, request: Request[Any, Any, Any], model_id: FromPath[str],
        services: NamedDependency[Services],
    ) -> ModelObject:  # fmt: skip
        """One served model or cold adapter by name (names may contain ``/``); with API keys
        in use, a name the caller's tenant may not use does not exist."""
        name = model_id.lstrip("/")
        tenant = _tenant(request, services)
        if tenant is not None and not may_use(tenant, name):
            names = services.resolver.registry.names()
            raise ModelNotFoundError(name, services.tenants.visible(tenant, names))
        served = services.resolver.registry.get(name)
        if served is not None:
            return model_object(served)
        for cold in services.resolver.cold():
            if cold.spec.name == name:
                return cold_model_object(cold, services.adapters)
        alias = services.aliases.get(name)
        if alias is not None:
            return alias_model_object(alias, services.resolver.registry)
        raise services.resolver.not_found(name)


def _tenant(request: Request[Any, Any, Any], services: Services) -> Tenant | None:
    """The caller's tenant (None while no API key exists); 401 without a valid key."""
    return services.tenants.identify(request.headers.get("authorization"))
