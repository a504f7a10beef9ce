"""vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` on the worker's status server.

They translate vLLM's bodies and answers (``proto.vllm_lora``) and call the
same engine routes as ``/v1/loras`` (``update/load_lora``, ``update/unload_lora``)
through the engine registry; they hold no LoRA logic of their own. Mounted
with the other LoRA routes when ``DYN_LORA_ENABLED`` is true, behind
``DYN_SYSTEM_AUTH_TOKEN``.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from litestar import Request, Response, post
from litestar.enums import MediaType

from lorafleet.proto.adapters import LoadLoraRequest, LoraSource
from lorafleet.proto.errors import InvalidRequestError, UnauthorizedError
from lorafleet.proto.inference import UpdateReply
from lorafleet.proto.vllm_lora import (
    LoadLoraAdapterRequest,
    UnloadLoraAdapterRequest,
    VllmErrorResponse,
    lora_path_uri,
    vllm_already_loaded,
    vllm_error,
    vllm_error_for_code,
    vllm_missing_load_fields,
    vllm_missing_unload_fields,
    vllm_not_found,
    vllm_success_message,
)
from lorafleet.worker.status_server import StatusState, read_json_object, retry_after

__all__ = ["load_lora_adapter", "unload_lora_adapter"]

_Body = TypeVar("_Body", bound=msgspec.Struct)


def _error(body: VllmErrorResponse) -> Response[Any]:
    status_code = body.error.code
    return Response(body, status_code=status_code, media_type=MediaType.JSON,
                    headers=retry_after(status_code))  # fmt: skip


def _reply_error(reply: UpdateReply) -> Response[Any] | None:
    if reply.error is None:
        return None
    return _error(vllm_error_for_code(reply.error.code, reply.error.message))


async def _admitted(
    request: Request[Any, Any, Any], status: StatusState, kind: type[_Body]
) -> _Body | Response[Any]:
    """The typed body after the auth check, or vLLM's 400/401 answer to send instead."""
    try:
        status.check_auth(request)
        return msgspec.convert(await read_json_object(request), kind)
    except (InvalidRequestError, UnauthorizedError) as exc:
        return _error(vllm_error(401 if isinstance(exc, UnauthorizedError) else 400, exc.message))
    except msgspec.ValidationError as exc:
        return _error(vllm_error(400, f"invalid {kind.__name__} body: {exc}"))


async def _is_loaded(status: StatusState, name: str) -> bool | Response[Any]:
    """Whether ``name`` is loaded here, or the error answer when listing fails."""
    reply = await status.call("update/list_loras", {})
    failed = _reply_error(reply)
    if failed is not None:
        return failed
    return name in reply.body.get("loras", {})


@post("/v1/load_lora_adapter", status_code=200)
async def load_lora_adapter(request: Request[Any, Any, Any], status: StatusState) -> Response[Any]:
    """vLLM's load: ``{"lora_name", "lora_path"}``; 200 with vLLM's plain-text answer."""
    body = await _admitted(request, status, LoadLoraAdapterRequest)
    if isinstance(body, Response):
        return body
    if not body.lora_name or not body.lora_path:
        return _error(vllm_missing_load_fields())
    try:
        uri = lora_path_uri(body.lora_path)
    except InvalidRequestError as exc:
        return _error(vllm_error(400, exc.message))
    loaded = await _is_loaded(status, body.lora_name)
    if isinstance(loaded, Response):
        return loaded
    if loaded and not body.load_inplace:
        return _error(vllm_already_loaded(body.lora_name))
    # load_inplace swaps make before break: the old version serves until the new one does,
    # and keeps serving if any step fails
    load = LoadLoraRequest(lora_name=body.lora_name, source=LoraSource(uri=uri, sha256=body.sha256),
                           replace=body.load_inplace)  # fmt: skip
    reply = await status.call("update/load_lora", msgspec.to_builtins(load))
    failed = _reply_error(reply)
    return failed or _text(vllm_success_message(body.lora_name, loaded=True))


@post("/v1/unload_lora_adapter", status_code=200)
async def unload_lora_adapter(
    request: Request[Any, Any, Any], status: StatusState
) -> Response[Any]:
    """vLLM's unload: ``{"lora_name"}``; 404 in vLLM's words when it is not loaded."""
    body = await _admitted(request, status, UnloadLoraAdapterRequest)
    if isinstance(body, Response):
        return body
    if not body.lora_name:
        return _error(vllm_missing_unload_fields())
    reply = await status.call("update/unload_lora", {"lora_name": body.lora_name})
    if reply.error is not None and reply.error.code == "not_found":
        loaded = await _is_loaded(status, body.lora_name)
        if loaded is False:
            return _error(vllm_not_found(body.lora_name))
    failed = _reply_error(reply)
    return failed or _text(vllm_success_message(body.lora_name, loaded=False))


def _text(message: str) -> Response[str]:
    return Response(message, status_code=200, media_type=MediaType.TEXT)
