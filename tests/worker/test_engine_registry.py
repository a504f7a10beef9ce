"""The engine registry in-process: the one place engine routes meet the wire (HTTP and NATS)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from lorafleet.proto.errors import ConflictError, ErrorInfo
from lorafleet.proto.inference import FinalChunk, GenerateRequest, TokenChunk
from lorafleet.worker.engine import EngineConfig, EngineRoute, LLMEngine
from lorafleet.worker.engine_registry import EngineRegistry


class Echo(msgspec.Struct, kw_only=True, frozen=True):
    word: str


class EchoEngine(LLMEngine):
    """An engine with one typed control: it answers the word, or fails as the word says."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | FinalChunk]:
        raise NotImplementedError

    def supported_controls(self) -> dict[str, EngineRoute[Any]]:
        return {"echo": EngineRoute(Echo, self._echo)}

    async def _echo(self, request: Echo) -> Echo:
        assert isinstance(request, Echo)  # the handler never sees a dict
        if request.word == "taken":
            raise ConflictError("the word is taken", lora_name="taken")
        if request.word == "crash":
            raise RuntimeError("engine bug")
        return request


@pytest.fixture
def registry() -> EngineRegistry:
    registry = EngineRegistry()
    registry.register(EchoEngine(EngineConfig(model="demo")))
    return registry


async def test_the_body_is_decoded_into_the_routes_struct_and_the_answer_encoded(
    registry: EngineRegistry,
) -> None:
    reply = await registry.call("control/echo", {"word": "hi", "unknown": 1})
    assert (reply.status_code, reply.body, reply.error) == (200, {"word": "hi"}, None)


async def test_a_body_of_the_wrong_shape_is_a_400_naming_the_struct(
    registry: EngineRegistry,
) -> None:
    reply = await registry.call("control/echo", {"word": 5})
    assert reply.status_code == 400 and reply.error is not None
    assert reply.error.code == "invalid_request" and "invalid Echo body" in reply.error.message
    assert reply.body == {
        "status": "error",
        "code": "invalid_request",
        "message": reply.error.message,
    }


async def test_an_error_is_typed_for_nats_and_keeps_its_fields_in_the_http_body(
    registry: EngineRegistry,
) -> None:
    reply = await registry.call("control/echo", {"word": "taken"})
    assert reply.status_code == 409
    assert reply.error == ErrorInfo(code="conflict", message="the word is taken")
    assert reply.body == {
        "status": "error", "code": "conflict", "message": "the word is taken", "lora_name": "taken",
    }  # fmt: skip


async def test_an_engine_bug_is_a_500_internal_error(registry: EngineRegistry) -> None:
    reply = await registry.call("control/echo", {"word": "crash"})
    assert reply.status_code == 500 and reply.error is not None
    assert reply.error.code == "internal_error" and "engine bug" in reply.error.message


async def test_unknown_routes_are_404_and_nothing_runs_before_register() -> None:
    registry = EngineRegistry()
    starting = await registry.call("control/echo", {"word": "hi"})
    assert starting.status_code == 503 and starting.body["code"] == "unavailable"
    registry.register(EchoEngine(EngineConfig(model="demo")))
    missing = await registry.call("update/nope", {})
    assert missing.status_code == 404 and missing.error is not None
    assert "control/echo" in missing.error.message
