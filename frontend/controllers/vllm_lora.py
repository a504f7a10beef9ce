"""vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``, fleet-wide.

A load declares the adapter in the desired state for every instance of its
base model (``replicas: "all"``); an unload deletes the declaration, and
workers unload their copies once idle. Bodies and answers are vLLM's
(``proto.vllm_lora``); the bearer token is ``DYN_ADMIN_TOKEN``, as for
``/v1/adapters``.
"""

from __future__ import annotations

from typing import Any, Final

from litestar import Controller, Response
from litestar.di import NamedDependency
from litestar.enums import MediaType
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody

from lorafleet.frontend.admin_auth import admin_post
from lorafleet.frontend.controllers.adapters import WRITE_ERRORS
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.frontend.services import Services
from lorafleet.proto.adapters import AdapterSpec, LoraSource, validate_adapter_spec
from lorafleet.proto.errors import InvalidRequestError, LorafleetError
from lorafleet.proto.vllm_lora import (
    LoadLoraAdapterRequest,
    UnloadLoraAdapterRequest,
    VllmErrorResponse,
    lora_path_uri,
    vllm_already_loaded,
    vllm_error_for_code,
    vllm_missing_load_fields,
    vllm_missing_unload_fields,
    vllm_not_found,
    vllm_success_message,
)

__all__ = ["VllmLoraController"]


def _vllm(description: str) -> ResponseSpec:
    return ResponseSpec(data_container=VllmErrorResponse, description=description)


LOAD_ERRORS: Final = {
    400: _vllm("Fields missing, already loaded (without load_inplace), or a bad name or path"),
    401: WRITE_ERRORS[401],
    503: _vllm("etcd is unavailable"),
}
UNLOAD_ERRORS: Final = {
    400: _vllm("lora_name missing"),
    401: WRITE_ERRORS[401],
    404: _vllm("The adapter is not in the desired state"),
    503: _vllm("etcd is unavailable"),
}


def _error(body: VllmErrorResponse) -> Response[Any]:
    return Response(body, status_code=body.error.code, media_type=MediaType.JSON)


def _text(message: str) -> Response[Any]:
    return Response(message, status_code=200, media_type=MediaType.TEXT)


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
        summary="vLLM's load: declare the adapter for every instance of its base model",
        status_code=200,
        responses=LOAD_ERRORS,
    )
    async def load(
        self,
        data: JSONBody[LoadLoraAdapterRequest],
        services: NamedDependency[Services],
    ) -> Response[Any]:
        """Store ``{"lora_name", "lora_path"}`` as desired state with ``replicas: "all"``."""
        if not data.lora_name or not data.lora_path:
            return _error(vllm_missing_load_fields())
        if services.desired.get(data.lora_name) is not None and not data.load_inplace:
            return _error(vllm_already_loaded(data.lora_name))
        try:
            source = LoraSource(uri=lora_path_uri(data.lora_path))
            base = _base_model(data, services.registry)
            spec = AdapterSpec(name=data.lora_name, base_model=base, source=source, replicas="all")
            await services.desired.apply(validate_adapter_spec(spec))
        except LorafleetError as exc:
            return _error(vllm_error_for_code(exc.code, exc.message))
        return _text(vllm_success_message(data.lora_name, loaded=True))

    @admin_post(
        "/unload_lora_adapter",
        operation_id="vllmUnloadLoraAdapter",
        summary="vLLM's unload: remove the adapter from the desired state",
        status_code=200,
        responses=UNLOAD_ERRORS,
    )
    async def unload(
        self, data: JSONBody[UnloadLoraAdapterRequest], services: NamedDependency[Services]
    ) -> Response[Any]:
        """Delete the desired state of ``lora_name``; 404 in vLLM's words when there is none."""
        if not data.lora_name:
            return _error(vllm_missing_unload_fields())
        try:
            deleted = await services.desired.delete(data.lora_name)
        except LorafleetError as exc:
            return _error(vllm_error_for_code(exc.code, exc.message))
        if not deleted:
            return _error(vllm_not_found(data.lora_name))
        return _text(vllm_success_message(data.lora_name, loaded=False))
