"""LoRA gating and the ``/v1/loras`` compatibility routes of the status server.

LoRA management exists only with both ``--enable-lora`` and
``DYN_LORA_ENABLED=true`` and an engine that serves adapters; otherwise every
LoRA route says what is missing. The compatibility routes are mounted whenever
``DYN_LORA_ENABLED`` is true (with vLLM's ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``, see ``worker.vllm_lora_routes``) and resolve to
the same handlers as ``/engine/update/*``; there an error body answers HTTP 500 unless it is the
caller's fault (4xx).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.handlers import BaseRouteHandler

from lorafleet.proto.inference import UpdateReply
from lorafleet.worker.adapter_engine import AdapterEngine
from lorafleet.worker.config import WorkerConfig
from lorafleet.worker.engine import LLMEngine
from lorafleet.worker.status_server import StatusState, admitted_body, reply_response
from lorafleet.worker.vllm_lora_routes import load_lora_adapter, unload_lora_adapter

__all__ = ["LORA_PATHS", "lora_missing", "lora_routes"]

LORA_PATHS: Final = ["update/load_lora", "update/unload_lora", "update/list_loras"]


def lora_missing(config: WorkerConfig, engine: LLMEngine) -> list[str]:
    """Why LoRA management is off here, one reason per missing switch; empty when it is on."""
    missing = []
    if not config.engine_config.enable_lora:
        missing.append("the worker was started without --enable-lora")
    if not config.lora_enabled:
        missing.append("DYN_LORA_ENABLED is not true")
    if not isinstance(engine, AdapterEngine):
        missing.append(f"the {config.engine} engine does not serve adapters")
    return missing


def lora_routes(config: WorkerConfig) -> list[BaseRouteHandler]:
    """The ``/v1/loras`` and vLLM routes, mounted whenever ``DYN_LORA_ENABLED`` is true (they
    say what is missing when management is off)."""
    if not config.lora_enabled:
        return []
    return [list_loras, load_lora, unload_lora, load_lora_adapter, unload_lora_adapter]


def _compat_response(reply: UpdateReply) -> Response[Any]:
    if reply.error is not None and not 400 <= reply.status_code < 500:
        return reply_response(msgspec.structs.replace(reply, status_code=500))
    return reply_response(reply)


async def _call(status: StatusState, path: str, body: dict[str, Any]) -> Response[Any]:
    return _compat_response(await status.call(path, body))


@get("/v1/loras")
async def list_loras(status: StatusState) -> Response[Any]:
    """List the loaded adapters (``list_loras``)."""
    return await _call(status, "update/list_loras", {})


@post("/v1/loras", status_code=200)
async def load_lora(request: Request[Any, Any, Any], status: StatusState) -> Response[Any]:
    """Load an adapter (``load_lora``); same body as ``/engine/update/load_lora``."""
    body = await admitted_body(request, status, mutating=True)
    if isinstance(body, Response):
        return body
    return await _call(status, "update/load_lora", body)


@delete("/v1/loras/{name:path}", status_code=200)
async def unload_lora(
    request: Request[Any, Any, Any], name: str, status: StatusState
) -> Response[Any]:
    """Unload adapter ``name`` (which may contain ``/``)."""
    admitted = await admitted_body(request, status, mutating=True)
    if isinstance(admitted, Response):
        return admitted
    return await _call(status, "update/unload_lora", {"lora_name": name.lstrip("/")})
