"""vLLM's runtime LoRA dialect: ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``.

Bodies, answers and error shapes as vLLM's OpenAI server gives them
(``vllm/entrypoints/openai/serving_models.py``), so vLLM's scripts and the
Gateway API Inference Extension's LoRA syncer work unchanged against the
worker and the frontend. Pure: no I/O; the routes live in ``worker`` and
``frontend``.
"""

from __future__ import annotations

from typing import Final

import msgspec

from lorafleet.proto.adapters import LoraName, Sha256, Uri
from lorafleet.proto.errors import InvalidRequestError, http_status

__all__ = [
    "LoadLoraAdapterRequest",
    "UnloadLoraAdapterRequest",
    "VllmErrorInfo",
    "VllmErrorResponse",
    "lora_path_uri",
    "vllm_already_loaded",
    "vllm_error",
    "vllm_error_for_code",
    "vllm_loading_message",
    "vllm_missing_load_fields",
    "vllm_missing_unload_fields",
    "vllm_not_found",
    "vllm_success_message",
]

VLLM_ERROR_TYPES: Final = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    409: "BadRequestError",
    429: "TooManyRequests",
    502: "BadGateway",
    503: "ServiceUnavailableError",
}
"""vLLM's ``type`` for each HTTP status we answer (anything else: InternalServerError)."""
INVALID_USER_INPUT: Final = "InvalidUserInput"


class LoadLoraAdapterRequest(msgspec.Struct, kw_only=True, frozen=True):
    """vLLM's load body: ``lora_path`` is a local path, an ``org/name`` Hub id, or a URI."""

    lora_name: LoraName = ""
    lora_path: Uri = ""
    load_inplace: bool = False
    """Replace an adapter of that name that is already loaded (vLLM >= 0.10)."""
    base_model_name: str | None = None
    """Frontend only, when several base models are served: which one the adapter is for."""
    sha256: Sha256 | None = None
    """Ours (vLLM has none): the content digest the adapter must have (``LoraSource.sha256``)."""


class UnloadLoraAdapterRequest(msgspec.Struct, kw_only=True, frozen=True):
    """vLLM's unload body (``lora_int_id`` is accepted and ignored, as vLLM's own is)."""

    lora_name: LoraName = ""
    lora_int_id: int | None = None


class VllmErrorInfo(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=False):
    """vLLM's error details; ``code`` is the HTTP status."""

    message: str
    type: str
    param: str | None = None
    code: int


class VllmErrorResponse(msgspec.Struct, kw_only=True, frozen=True):
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: VllmErrorInfo


def vllm_error(status: int, message: str, err_type: str | None = None) -> VllmErrorResponse:
    """An error body in vLLM's shape; ``err_type`` defaults to vLLM's name for ``status``."""
    kind = err_type or VLLM_ERROR_TYPES.get(status, "InternalServerError")
    return VllmErrorResponse(error=VllmErrorInfo(message=message, type=kind, code=status))


def vllm_error_for_code(code: str, message: str) -> VllmErrorResponse:
    """One of our error codes (``proto.errors``) as vLLM's body."""
    return vllm_error(http_status(code), message)


def vllm_missing_load_fields() -> VllmErrorResponse:
    """vLLM's answer to a load body without ``lora_name`` or ``lora_path``."""
    return vllm_error(400, "Both 'lora_name' and 'lora_path' must be provided.", INVALID_USER_INPUT)


def vllm_missing_unload_fields() -> VllmErrorResponse:
    """vLLM's answer to an unload body without ``lora_name``."""
    message = "either 'lora_name' and 'lora_int_id' needs to be provided."
    return vllm_error(400, message, INVALID_USER_INPUT)


def vllm_already_loaded(name: str) -> VllmErrorResponse:
    """vLLM's answer to loading a name that is loaded (without ``load_inplace``)."""
    message = f"The lora adapter '{name}' has already been loaded."
    return vllm_error(400, message, INVALID_USER_INPUT)


def vllm_not_found(name: str) -> VllmErrorResponse:
    """vLLM's answer to unloading a name that is not loaded."""
    return vllm_error(404, f"The lora adapter '{name}' cannot be found.")


def vllm_success_message(name: str, *, loaded: bool) -> str:
    """vLLM's plain-text 200 answer."""
    return f"Success: LoRA adapter '{name}' {'added' if loaded else 'removed'} successfully."


def vllm_loading_message(name: str, waited_s: float) -> str:
    """Our 202 answer (vLLM has none): declared, not loaded anywhere yet after the wait."""
    return (
        f"Accepted: LoRA adapter '{name}' is declared and still loading after {waited_s:g} s; "
        f"GET /v1/adapters/{name} shows its state."
    )


def lora_path_uri(lora_path: str) -> str:
    """Our ``source.uri`` for vLLM's ``lora_path``.

    A URI (``s3://...``) is kept; an absolute path becomes ``file://``; a bare
    ``org/name`` is a Hub repository, as vLLM resolves it (``hf://org/name``).
    Relative and ``~`` paths are refused: they depend on the process that reads them.
    """
    path = lora_path.strip()
    if "://" in path:
        return path
    if path.startswith("/"):
        return f"file://{path}"
    if path.startswith("~"):
        raise InvalidRequestError(
            f"lora_path {path!r} starts with '~'; give the absolute path (whose home?)"
        )
    if path.startswith(".") or path.count("/") != 1:
        raise InvalidRequestError(
            f"lora_path {path!r} is neither an absolute path, a URI (s3://, file://, hf://) "
            "nor a Hub repository id org/name"
        )
    return f"hf://{path}"
