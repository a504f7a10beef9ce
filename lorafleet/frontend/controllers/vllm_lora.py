"""vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``, fleet-wide.

A load declares the adapter in the desired state for every instance of its
base model (``replicas: "all"``) and answers as vLLM does: 200 once a live
instance has it loaded, or the error that stopped it (the desired state is then
put back); 202 when it is still loading after the on-demand timeout. Statically
wrong input answers 4xx at once (``source_check``). An unload removes a declared
adapter from the desired state, and an unmanaged one (loaded straight onto
workers) from every instance that holds it (``lora_writes``). Bodies and answers
are vLLM's (``proto.vllm_lora``); the bearer token is ``DYN_ADMIN_TOKEN``, as for
``/v1/adapters``.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from litestar import Controller, Response
from litestar.di import NamedDependency
from litestar.enums import MediaType
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody

from lorafleet.frontend.admin_auth import admin_post
from lorafleet.frontend.controllers.adapters import WRITE_ERRORS
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.frontend.services import Services
from lorafleet.frontend.source_check import check_source
from lorafleet.proto.adapters import AdapterSpec, LoraSource, validate_adapter_spec
from lorafleet.proto.errors import InvalidRequestError, LorafleetError
from lorafleet.proto.vllm_lora import (
    LoadLoraAdapterRequest,
    UnloadLoraAdapterRequest,
    VllmErrorResponse,
    lora_path_uri,
    vllm_already_loaded,
    vllm_error_for_code,
    vllm_loading_message,
    vllm_missing_load_fields,
    vllm_missing_unload_fields,
    vllm_not_found,
    vllm_success_message,
)

__all__ = ["VllmLoraController"]


def _vllm(description: str) -> ResponseSpec:
    return ResponseSpec(data_container=VllmErrorResponse, description=description)


LOAD_ERRORS: Final = {
    202: ResponseSpec(data_container=str, description="Declared, still loading after the wait"),
    400: _vllm("Fields missing, already loaded (without load_inplace), or a bad name or path"),
    401: WRITE_ERRORS[401],
    404: _vllm("The source does not exist on the workers (the desired state is put back)"),
    409: _vllm("lora_name is an alias's name (/v1/aliases), as for POST /v1/adapters"),
    503: _vllm("etcd is unavailable"),
}
UNLOAD_ERRORS: Final = {
    400: _vllm("lora_name missing"),
    401: WRITE_ERRORS[401],
    404: _vllm("No adapter of that name is declared or loaded"),
    503: _vllm("etcd is unavailable"),
}


def _error(body: VllmErrorResponse) -> Response[Any]:
    return Response(body, status_code=body.error.code, media_type=MediaType.JSON)


def _text(message: str, status_code: int = 200) -> Response[Any]:
    return Response(message, status_code=status_code, media_type=MediaType.TEXT)


def _loaded(
    name: str, source: LoraSource, declared: AdapterSpec | None, registry: ModelRegistry
) -> bool:
    """vLLM's "already loaded": a live instance serves ``name``, or it is declared from another
    source (a declared adapter not loaded yet, from this source, is loaded: a retry after a
    202 waits again rather than hearing that it worked)."""
    served = registry.get(name)
    if served is not None and served.parent is not None:
        return True
    return declared is not None and declared.source != source


def _max_rank(base_model: str, registry: ModelRegistry) -> int:
    """The largest rank limit of the base model's instances: an adapter above it fits none
    (0: unknown, or an instance says no limit). Workers that differ: one that fits only the
    larger instances goes there (``fleet.adapter_fit``), so the smallest limit refuses nothing."""
    base = registry.get(base_model)
    ranks = [
        card.max_lora_rank
        for instance in (base.instances if base is not None else ())
        if (card := registry.card_on(base_model, instance.instance_id)) is not None
    ]
    return 0 if 0 in ranks else max(ranks, default=0)


def _base_model(body: LoadLoraAdapterRequest, registry: ModelRegistry) -> str:
    """The adapter's base model: ``base_model_name``, or the one base model served."""
    if body.base_model_name:
        return body.base_model_name
    bases = sorted(m.name for m in registry.models() if m.parent is None)
    if len(bases) != 1:
        served = ", ".join(bases) or "none"
        raise InvalidRequestError(
            f"cannot tell which base model adapter {body.lora_name!r} is for: base models "
            f'served now: {served}; add "base_model_name" to the body'
        )
    return bases[0]


class VllmLoraController(Controller):
    """vLLM's runtime LoRA routes over the fleet's desired state."""

    path = "/v1"
    tags = ["adapters"]

    @admin_post(
        "/load_lora_adapter",
        operation_id="vllmLoadLoraAdapter",
        summary="vLLM's load: declare the adapter for every instance of its base model, "
        "answered once one has loaded it",
        status_code=200,
        responses=LOAD_ERRORS,
    )
    async def load(
        self,
        data: JSONBody[LoadLoraAdapterRequest],
        services: NamedDependency[Services],
    ) -> Response[Any]:
        """Store ``{"lora_name", "lora_path"}`` as desired state with ``replicas: "all"`` and
        wait until a live instance has it (200), it failed everywhere (its error), or the
        wait ends (202)."""
        if not data.lora_name or not data.lora_path:
            return _error(vllm_missing_load_fields())
        name, registry = data.lora_name, services.registry
        try:
            services.alias_checks.check_adapter_name(name)
            source = LoraSource(uri=lora_path_uri(data.lora_path), sha256=data.sha256)
            declared = services.desired.get(name)
            if not data.load_inplace and _loaded(name, source, declared, registry):
                return _error(vllm_already_loaded(name))
            if declared is not None:  # a new source (load_inplace), the rest as declared
                spec = msgspec.structs.replace(declared, source=source)
            else:
                base = _base_model(data, registry)
                spec = AdapterSpec(name=name, base_model=base, source=source, replicas="all")
            validate_adapter_spec(spec)
            check_source(name, source.uri, max_rank=_max_rank(spec.base_model, registry))
            outcome = await services.writes.load(spec, reload=data.load_inplace)
        except LorafleetError as exc:
            return _error(vllm_error_for_code(exc.code, exc.message))
        if outcome == "loading":
            return _text(vllm_loading_message(name, services.writes.timeout_s), status_code=202)
        return _text(vllm_success_message(name, loaded=True))

    @admin_post(
        "/unload_lora_adapter",
        operation_id="vllmUnloadLoraAdapter",
        summary="vLLM's unload: remove the adapter from the desired state, or an unmanaged one "
        "from every instance",
        status_code=200,
        responses=UNLOAD_ERRORS,
    )
    async def unload(
        self, data: JSONBody[UnloadLoraAdapterRequest], services: NamedDependency[Services]
    ) -> Response[Any]:
        """Delete the desired state of ``lora_name``, or unload it from the instances holding
        it when it is unmanaged; 404 in vLLM's words when the fleet has no such adapter."""
        if not data.lora_name:
            return _error(vllm_missing_unload_fields())
        try:
            deleted = await services.writes.unload(data.lora_name)
        except LorafleetError as exc:
            return _error(vllm_error_for_code(exc.code, exc.message))
        if not deleted:
            return _error(vllm_not_found(data.lora_name))
        return _text(vllm_success_message(data.lora_name, loaded=False))
