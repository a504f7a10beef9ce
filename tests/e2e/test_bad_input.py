"""The bad-input walk: every route of the frontend and the worker, fed client mistakes.

Each row of ``CASES`` is one mistake an operator or a client can make: a body
too deep, an integer msgpack cannot carry, a prompt NATS cannot carry, a URI
of 900 KB, a wrong method, a field out of its documented bound. Each must be
answered with the stated 4xx and a message that names the problem, never a
5xx, and never by echoing a long input whole. Real ``python -m lorafleet.frontend`` and
``python -m lorafleet.worker`` (mocker engine, LoRA on) processes, real etcd and NATS.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from lorafleet.proto.limits import MAX_JSON_DEPTH
from tests.processes import ServiceProcess, start_frontend, start_worker

pytestmark = pytest.mark.slow

Service = Literal["frontend", "worker"]
MAX_MESSAGE_CHARS = 1000
"""No error message may be longer: long inputs are cut, never echoed whole."""

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
DEEP = b"[" * 10_000 + b"]" * 10_000
HUGE_URI = "file:///" + "a" * 900_000
TOO_BIG_FOR_WIRE = 2**64 + 5
NATS_MAX_PAYLOAD_BYTES = 1 << 20  # nats-server's default, which the test server keeps


@dataclass(frozen=True)
class Case:
    """One mistake: where it is sent, what is sent, the status and words the answer must have."""

    id: str
    method: str
    path: str
    body: bytes | None
    status: int
    words: str
    service: Service


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _chat(**fields: Any) -> bytes:
    return _json({"model": "demo", "messages": [{"role": "user", "content": "hi"}], **fields})


def _completion(**fields: Any) -> bytes:
    return _json({"model": "demo", "prompt": "hi", **fields})


def _spec(**fields: Any) -> bytes:
    return _json({"name": "walk", "base_model": "demo", "source": {"uri": "file:///x"}, **fields})


def _load(**fields: Any) -> bytes:
    return _json({"lora_name": "walk", "source": {"uri": "file:///x"}, **fields})


def _turn(**fields: Any) -> bytes:
    return _chat(messages=[{"role": "user", "content": "x", **fields}])


DEEP_FIELD = b'{"model": "demo", "messages": ' + DEEP + b"}"
DEPTH = f"{MAX_JSON_DEPTH} levels deep"
TWO_MIB = "x" * (2 << 20)
LOAD = "/engine/update/load_lora"
UNLOAD = "/engine/update/unload_lora"
LIST = "/engine/update/list_loras"
ADAPTERS = "/v1/adapters"

FRONTEND_CASES = [Case(*row, service="frontend") for row in [
    ("chat-deep-array", "POST", CHAT, DEEP, 400, DEPTH),
    ("chat-deep-field", "POST", CHAT, DEEP_FIELD, 400, DEPTH),
    ("chat-not-json", "POST", CHAT, b"{not json", 400, "not valid JSON"),
    ("chat-truncated-json", "POST", CHAT, b'{"model": "demo"', 400, "not valid JSON"),
    ("chat-empty", "POST", CHAT, b"", 400, "empty"),
    ("chat-array-body", "POST", CHAT, b"[1, 2]", 400, "object"),
    ("chat-no-model", "POST", CHAT, _json({"messages": [{"role": "user"}]}), 400, "model"),
    ("chat-no-messages", "POST", CHAT, _json({"model": "demo"}), 400, "messages"),
    ("chat-no-turns", "POST", CHAT, _chat(messages=[]), 400, "messages"),
    ("chat-empty-model", "POST", CHAT, _chat(model=""), 400, "model"),
    ("chat-long-model", "POST", CHAT, _chat(model="m" * 600), 400, "model"),
    ("chat-bad-role", "POST", CHAT, _turn(role="wizard"), 400, "role"),
    ("chat-content-number", "POST", CHAT, _turn(content=5), 400, "content"),
    ("chat-image-part", "POST", CHAT, _turn(content=[{"type": "image_url"}]), 400, "type"),
    ("chat-part-without-text", "POST", CHAT, _turn(content=[{"type": "text"}]), 400, "text"),
    ("chat-long-type", "POST", CHAT, _turn(content=[{"type": "t" * 900}]), 400, "type"),
    ("chat-long-turn-name", "POST", CHAT, _turn(name="n" * 1000), 400, "name"),
    ("chat-too-many-turns", "POST", CHAT, _chat(messages=[{"role": "user"}] * 5000), 400,
     "messages"),
    ("chat-temperature-high", "POST", CHAT, _chat(temperature=3), 400, "temperature"),
    ("chat-temperature-text", "POST", CHAT, _chat(temperature="hot"), 400, "temperature"),
    ("chat-top-p-zero", "POST", CHAT, _chat(top_p=0), 400, "top_p"),
    ("chat-max-tokens-zero", "POST", CHAT, _chat(max_tokens=0), 400, "max_tokens"),
    ("chat-max-tokens-negative", "POST", CHAT, _chat(max_tokens=-1), 400, "max_tokens"),
    ("chat-max-tokens-huge", "POST", CHAT, _chat(max_tokens=2**40), 400, "max_tokens"),
    ("chat-max-completion-tokens-wire", "POST", CHAT,
     _chat(max_completion_tokens=TOO_BIG_FOR_WIRE), 400, "max_completion_tokens"),
    ("chat-seed-wire", "POST", CHAT, _chat(seed=TOO_BIG_FOR_WIRE), 400, "seed"),
    ("chat-seed-negative-wire", "POST", CHAT, _chat(seed=-(2**64)), 400, "seed"),
    ("chat-seed-float", "POST", CHAT, _chat(seed=1.5), 400, "seed"),
    ("chat-n-two", "POST", CHAT, _chat(n=2), 400, "n"),
    ("chat-n-wire", "POST", CHAT, _chat(n=10**30), 400, "n"),
    ("chat-too-many-stops", "POST", CHAT, _chat(stop=["x"] * 17), 400, "stop"),
    ("chat-empty-stop", "POST", CHAT, _chat(stop=[""]), 400, "stop"),
    ("chat-long-stop", "POST", CHAT, _chat(stop="s" * 2000), 400, "stop"),
    ("chat-stream-text", "POST", CHAT, _chat(stream="yes"), 400, "stream"),
    ("chat-stream-options-alone", "POST", CHAT, _chat(stream_options={"include_usage": True}),
     400, "stream_options"),
    ("chat-long-user", "POST", CHAT, _chat(user="u" * 1000), 400, "user"),
    ("chat-presence-penalty-high", "POST", CHAT, _chat(presence_penalty=3), 400,
     "presence_penalty"),
    ("chat-frequency-penalty-low", "POST", CHAT, _chat(frequency_penalty=-3), 400,
     "frequency_penalty"),
    ("chat-repetition-penalty-zero", "POST", CHAT, _chat(repetition_penalty=0), 400,
     "repetition_penalty"),
    ("chat-top-logprobs-high", "POST", CHAT, _chat(logprobs=True, top_logprobs=21), 400,
     "top_logprobs"),
    ("chat-top-logprobs-alone", "POST", CHAT, _chat(top_logprobs=2), 400, "top_logprobs"),
    ("chat-logprobs-text", "POST", CHAT, _chat(logprobs="yes"), 400, "logprobs"),
    ("chat-too-many-tools", "POST", CHAT, _chat(tools=[{"type": "function"}] * 200), 400,
     "tools"),
    ("chat-tools", "POST", CHAT, _chat(tools=[{"type": "function"}]), 400, "tools"),
    ("chat-tool-choice-long", "POST", CHAT, _chat(tool_choice="t" * 1000), 400, "tool_choice"),
    ("chat-response-format-json", "POST", CHAT, _chat(response_format={"type": "json_object"}),
     400, "response_format"),
    ("chat-response-format-text", "POST", CHAT, _chat(response_format="json"), 400,
     "response_format"),
    ("completion-logprobs-high", "POST", COMPLETIONS, _completion(logprobs=21), 400, "logprobs"),
    ("completion-logprobs-negative", "POST", COMPLETIONS, _completion(logprobs=-1), 400,
     "logprobs"),
    ("chat-unknown-model", "POST", CHAT, _chat(model="no-such"), 404, "does not exist"),
    ("chat-over-nats-payload", "POST", CHAT, _turn(content=TWO_MIB), 413, "max_payload"),
    ("chat-413-names-the-limit", "POST", CHAT, _turn(content=TWO_MIB), 413,
     str(NATS_MAX_PAYLOAD_BYTES)),
    ("chat-stream-over-nats-payload", "POST", CHAT,
     _chat(messages=[{"role": "user", "content": TWO_MIB}], stream=True), 413, "max_payload"),
    ("chat-get", "GET", CHAT, None, 405, "POST"),
    ("completions-deep", "POST", COMPLETIONS, DEEP, 400, DEPTH),
    ("completions-no-prompt", "POST", COMPLETIONS, _json({"model": "demo"}), 400, "prompt"),
    ("completions-prompt-number", "POST", COMPLETIONS, _completion(prompt=7), 400, "prompt"),
    ("completions-prompt-empty", "POST", COMPLETIONS, _completion(prompt=[]), 400, "prompt"),
    ("completions-batch", "POST", COMPLETIONS, _completion(prompt=["a", "b"]), 400, "batched"),
    ("completions-echo", "POST", COMPLETIONS, _completion(echo=True), 400, "echo"),
    ("completions-seed-wire", "POST", COMPLETIONS, _completion(seed=TOO_BIG_FOR_WIRE), 400,
     "seed"),
    ("completions-top-p-high", "POST", COMPLETIONS, _completion(top_p=1.5), 400, "top_p"),
    ("completions-over-nats-payload", "POST", COMPLETIONS, _completion(prompt=TWO_MIB), 413,
     "max_payload"),
    ("completions-over-http-limit", "POST", COMPLETIONS, _completion(prompt="x" * 11_000_000),
     413, "10000000"),
    ("completions-delete", "DELETE", COMPLETIONS, None, 405, "POST"),
    ("models-put", "PUT", "/v1/models", b"{}", 405, "GET"),
    ("models-post", "POST", "/v1/models", _chat(), 405, "GET"),
    ("model-delete", "DELETE", "/v1/models/demo", None, 405, "GET"),
    ("model-long-name", "GET", "/v1/models/" + "m" * 3000, None, 404, "does not exist"),
    ("frontend-no-route", "GET", "/v1/nowhere", None, 404, "Not Found"),
    ("adapters-deep", "POST", ADAPTERS, DEEP, 400, DEPTH),
    ("adapters-not-json", "POST", ADAPTERS, b"{", 400, "not valid JSON"),
    ("adapters-no-base-model", "POST", ADAPTERS, _json({"name": "w", "source": {"uri": "f"}}),
     400, "base_model"),
    ("adapters-no-source", "POST", ADAPTERS, _json({"name": "w", "base_model": "demo"}), 400,
     "source"),
    ("adapters-unsafe-name", "POST", ADAPTERS, _spec(name="../x"), 400, "not safe"),
    ("adapters-long-name", "POST", ADAPTERS, _spec(name="n" * 300), 400, "name"),
    ("adapters-long-base-model", "POST", ADAPTERS, _spec(base_model="b" * 600), 400,
     "base_model"),
    ("adapters-huge-uri", "POST", ADAPTERS, _spec(source={"uri": HUGE_URI}), 400, "source.uri"),
    ("adapters-uri-without-scheme", "POST", ADAPTERS, _spec(source={"uri": "/x"}), 400,
     "source.uri"),
    ("adapters-replicas-negative", "POST", ADAPTERS, _spec(replicas=-2), 400, "replicas"),
    ("adapters-replicas-wire", "POST", ADAPTERS, _spec(replicas=TOO_BIG_FOR_WIRE), 400,
     "replicas"),
    ("adapters-replicas-text", "POST", ADAPTERS, _spec(replicas="some"), 400, "replicas"),
    ("adapters-pinned-text", "POST", ADAPTERS, _spec(pinned="yes"), 400, "pinned"),
    ("adapters-put", "PUT", ADAPTERS, _spec(), 405, "POST"),
    ("adapter-unknown", "GET", ADAPTERS + "/nope", None, 404, "not in the desired state"),
    ("adapter-delete-long-name", "DELETE", ADAPTERS + "/" + "n" * 3000, None, 404,
     "not in the desired state"),
]]  # fmt: skip

WORKER_CASES = [Case(*row, service="worker") for row in [
    ("load-deep", "POST", LOAD, DEEP, 400, DEPTH),
    ("load-not-json", "POST", LOAD, b"{not json", 400, "not valid JSON"),
    ("load-array-body", "POST", LOAD, b"[1]", 400, "JSON object"),
    ("load-no-name", "POST", LOAD, _json({"source": {"uri": "file:///x"}}), 400, "lora_name"),
    ("load-name-number", "POST", LOAD, _load(lora_name=7), 400, "lora_name"),
    ("load-unsafe-name", "POST", LOAD, _load(lora_name="../etc"), 400, "not safe"),
    ("load-long-name", "POST", LOAD, _load(lora_name="n" * 300), 400, "lora_name"),
    ("load-no-source", "POST", LOAD, _json({"lora_name": "walk"}), 400, "source"),
    ("load-huge-uri", "POST", LOAD, _load(source={"uri": HUGE_URI}), 400, "source.uri"),
    ("load-unsupported-scheme", "POST", LOAD, _load(source={"uri": "ftp://host/x"}), 400,
     "unsupported scheme"),
    ("load-not-a-uri", "POST", LOAD, _load(source={"uri": "not a uri"}), 400, "not a URI"),
    ("load-path-too-long", "POST", LOAD, _load(source={"uri": "file:///" + "é/" * 1500}), 400,
     "too long"),
    ("load-component-too-long", "POST", LOAD, _load(source={"uri": "file:///" + "a" * 300}),
     400, "too long"),
    ("load-unparseable-file-uri", "POST", LOAD, _load(source={"uri": "file://[::1/x"}), 400,
     "not a file URI"),
    ("load-bad-s3-bucket", "POST", LOAD, _load(source={"uri": "s3://Bad_Bucket!/x"}), 400,
     "not a valid S3 bucket"),
    ("load-body-over-1mib", "POST", LOAD, b"x" * (2 << 20), 413, "1048576"),
    ("load-get", "GET", LOAD, None, 405, "POST"),
    ("unload-deep", "POST", UNLOAD, DEEP, 400, DEPTH),
    ("unload-name-list", "POST", UNLOAD, _json({"lora_name": []}), 400, "lora_name"),
    ("unload-unknown", "POST", UNLOAD, _json({"lora_name": "never-loaded"}), 404,
     "never-loaded"),
    ("list-deep", "POST", LIST, DEEP, 400, DEPTH),
    ("list-string-body", "POST", LIST, b'"text"', 400, "JSON object"),
    ("engine-unknown-route", "POST", "/engine/update/nope", b"{}", 404, "no engine route"),
    ("loras-deep", "POST", "/v1/loras", DEEP, 400, DEPTH),
    ("loras-huge-uri", "POST", "/v1/loras", _load(source={"uri": HUGE_URI}), 400, "source.uri"),
    ("loras-no-source", "POST", "/v1/loras", _json({"lora_name": "walk"}), 400, "source"),
    ("loras-body-over-1mib", "POST", "/v1/loras", b"x" * (2 << 20), 413, "1048576"),
    ("loras-put", "PUT", "/v1/loras", _load(), 405, "GET"),
    ("loras-delete-long-name", "DELETE", "/v1/loras/" + "n" * 3000, None, 400, "lora_name"),
    ("loras-delete-unknown", "DELETE", "/v1/loras/never-loaded", None, 404, "never-loaded"),
    ("health-post", "POST", "/health", b"{}", 405, "GET"),
    ("worker-no-route", "GET", "/nowhere", None, 404, "no route"),
]]  # fmt: skip


CASES = FRONTEND_CASES + WORKER_CASES


@pytest.fixture(scope="module")
def services(
    tmp_path_factory: pytest.TempPathFactory, etcd_url: str, nats_url: str
) -> Iterator[dict[Service, ServiceProcess]]:
    """A mocker worker serving ``demo`` with LoRA on, and a frontend, in their own namespace."""
    log_dir: Path = tmp_path_factory.mktemp("bad-input")
    namespace = f"bad{uuid.uuid4().hex[:8]}"
    worker = start_worker(
        log_dir, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace,
        args=("--engine", "mocker", "--enable-lora"), env={"DYN_LORA_ENABLED": "true"},
    )  # fmt: skip
    frontend = start_frontend(log_dir, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace)
    try:
        yield {"frontend": frontend, "worker": worker}
    finally:
        frontend.terminate()
        worker.terminate()


def _message(service: Service, answer: httpx.Response) -> str:
    """The error message in the service's error shape (OpenAI's, or the engine routes')."""
    body = answer.json()
    return str(body["error"]["message"] if service == "frontend" else body["message"])


def test_the_walk_has_at_least_60_cases_over_every_route() -> None:
    assert len(CASES) >= 60
    assert len({case.id for case in CASES}) == len(CASES)
    paths = {case.path for case in CASES}
    for route in (CHAT, COMPLETIONS, "/v1/models", ADAPTERS, "/v1/loras", LOAD, UNLOAD, LIST):
        assert route in paths


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_client_mistake_is_a_4xx_with_a_message(
    services: dict[Service, ServiceProcess], case: Case
) -> None:
    url = services[case.service].url + case.path
    headers = {"Content-Type": "application/json"}
    answer = httpx.request(case.method, url, content=case.body, headers=headers, timeout=60)
    assert answer.status_code == case.status, answer.text[:MAX_MESSAGE_CHARS]
    message = _message(case.service, answer)
    assert case.words in message
    assert len(message) < MAX_MESSAGE_CHARS, "a long input was echoed whole"
    if case.status == 405:
        assert case.words in answer.headers["Allow"]


def test_the_openapi_document_shows_the_bounds(services: dict[Service, ServiceProcess]) -> None:
    schemas = httpx.get(services["frontend"].url + "/openapi.json").json()["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert (chat["seed"]["minimum"], chat["seed"]["maximum"]) == (-(2**63), 2**63 - 1)
    assert chat["max_tokens"]["maximum"] == 2**31 - 1
    assert chat["model"]["maxLength"] == 512
    assert chat["messages"]["maxItems"] == 4096
    assert "16" in chat["stop"]["description"]
    assert schemas["LoraSource"]["properties"]["uri"]["maxLength"] == 4096
    assert "65536" in schemas["AdapterSpec"]["properties"]["replicas"]["description"]
