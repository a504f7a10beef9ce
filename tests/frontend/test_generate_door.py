"""The generate routes' one door: bodies, hang-ups, the body timeout, and what is counted.

Real HTTP (raw sockets where a client must misbehave), etcd and NATS, stand-in workers.
A client that leaves at any point is counted and logged as 499 and its request is
cancelled at the worker; a body too slow is answered 408; nothing of it is a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import structlog

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend import access_log
from lorafleet.frontend.config import FrontendConfig
from lorafleet.proto.errors import ErrorInfo
from tests.frontend.conftest import FAST_DISPATCH, RunningFrontend, run_frontend, wait_for_models
from tests.frontend.stand_in import Behaviour, StandInWorker

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SLOW_BODIES = 500
NORMAL_REQUESTS = 40


def _chat(**fields: object) -> dict:
    return {"model": "demo", "messages": [{"role": "user", "content": "say hi"}], **fields}


def _count(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample of ``/metrics`` text, 0 when absent."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in metrics.splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _metrics(frontend: RunningFrontend) -> str:
    return (await frontend.http.get("/metrics")).text


async def _until(condition, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def _start(workers, nats_url, etcd, namespace, **kwargs) -> StandInWorker:
    worker = await StandInWorker(nats_url, etcd, namespace, "demo", **kwargs).start()
    workers.append(worker)
    return worker


@pytest.fixture
def access_lines(monkeypatch) -> list[dict]:
    """The access lines the frontend writes from now on (the tests' log level hides them:
    the access logger writes here instead, at info)."""
    capture = structlog.testing.LogCapture()
    logger = structlog.wrap_logger(
        None, processors=[capture], wrapper_class=structlog.make_filtering_bound_logger(0)
    )
    monkeypatch.setattr(access_log, "log", logger)
    return capture.entries


@contextlib.asynccontextmanager
async def _open(
    frontend: RunningFrontend,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = frontend.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _head(path: str, length: int, *, request_id: str = "r1") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"x-request-id: {request_id}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


@pytest.fixture
async def slow_body_frontend(etcd_url, nats_url, namespace) -> AsyncIterator[RunningFrontend]:
    config = FrontendConfig(namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url, dispatch=FAST_DISPATCH)  # fmt: skip
    async with run_frontend(dataclasses.replace(config, body_timeout_s=3.0)) as running:
        yield running


@pytest.mark.parametrize("path", [CHAT, CHAT + "/", COMPLETIONS])
@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"", None, "body is empty"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}', "model",
         "required field is missing"),
        (b'{"model": "demo", "messages": "hi", "prompt": 5}', None, "Expected"),
        (b"[" * 100 + b"]" * 100, None, "levels deep"),
    ],
)  # fmt: skip
async def test_a_bad_body_is_a_400_naming_the_problem_counted_as_the_client_s(
    frontend, path, body, param, words
) -> None:
    response = await frontend.http.post(path, content=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request")
    assert words in error["message"]
    if param is not None:
        assert error["param"] == param
    endpoint = "chat" if path.startswith(CHAT) else "completions"
    counted = _count(await _metrics(frontend), "lorafleet_frontend_errors_total",
                     endpoint=endpoint, model="", code="invalid_request")  # fmt: skip
    assert counted == 1


async def test_litestar_still_describes_the_routes_and_refuses_other_methods(frontend) -> None:
    document = (await frontend.http.get("/openapi.json")).json()
    for path, operation in ((CHAT, "createChatCompletion"), (COMPLETIONS, "createCompletion")):
        described = document["paths"][path]["post"]
        assert described["operationId"] == operation
        assert "requestBody" in described
        refused = await frontend.http.get(path)
        assert refused.status_code == 405
        assert refused.json()["error"]["code"] == "method_not_allowed"


async def test_a_worker_s_refusal_of_the_request_is_counted_as_the_client_s_error(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    error = ErrorInfo(code="invalid_request", message="prompt is longer than the context")
    await _start(workers, nats_url, etcd, namespace, behaviour=Behaviour.FAIL, error=error)
    await wait_for_models(frontend, {"demo"})
    for stream in (False, True):
        assert (await frontend.http.post(CHAT, json=_chat(stream=stream))).status_code == 400
    metrics = await _metrics(frontend)
    labels = {"endpoint": "chat", "model": "demo"}
    assert _count(metrics, "lorafleet_frontend_errors_total", **labels, code="invalid_request") == 2
    assert _count(metrics, "lorafleet_frontend_errors_total", **labels, code="upstream_error") == 0


async def test_a_worker_s_429_reaches_the_client_with_retry_after(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    """A worker without a free slot answers ``capacity``; the client's 429, whole or streamed,
    carries ``Retry-After`` as every other 429 does, so OpenAI's client waits and retries."""
    error = ErrorInfo(code="capacity", message="no free LoRA slot: every slot is in use")
    await _start(workers, nats_url, etcd, namespace, behaviour=Behaviour.FAIL, error=error)
    await wait_for_models(frontend, {"demo"})
    for stream in (False, True):
        refused = await frontend.http.post(CHAT, json=_chat(stream=stream))
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "capacity"
        assert refused.headers.get("retry-after") == "1", refused.headers


async def test_a_client_that_hangs_up_during_its_body_is_counted_and_logged_as_499(
    frontend, access_lines
) -> None:
    async with _open(frontend) as (_reader, writer):
        writer.write(_head(CHAT, 100, request_id="gone-in-body") + b'{"model": ')
        await writer.drain()
    await _until(lambda: access_lines)
    assert [(e["route"], e["status"]) for e in access_lines] == [(CHAT, 499)]
    metrics = await _metrics(frontend)
    labels = {"endpoint": "chat", "model": ""}
    assert _count(metrics, "lorafleet_frontend_requests_total", **labels, status="499") == 1
    assert _count(metrics, "lorafleet_frontend_requests_total", **labels, status="500") == 0
    assert _count(metrics, "lorafleet_frontend_errors_total", **labels, code="client_gone") == 1


async def test_a_hang_up_during_a_body_for_litestar_s_routes_is_499_too(
    frontend, access_lines
) -> None:
    async with _open(frontend) as (_reader, writer):
        writer.write(_head("/v1/adapters", 100) + b'{"name": ')
        await writer.drain()
    await _until(lambda: access_lines)
    assert [(e["route"], e["status"]) for e in access_lines] == [("/v1/adapters", 499)]


async def test_a_client_that_hangs_up_before_its_first_token_cancels_it_counted_as_499(
    frontend, workers, nats_url, etcd, namespace, access_lines
) -> None:
    worker = await _start(workers, nats_url, etcd, namespace, token_delay_s=60)
    await wait_for_models(frontend, {"demo"})
    body = json.dumps(_chat(stream=True, max_tokens=5)).encode()
    async with _open(frontend) as (_reader, writer):
        writer.write(_head(CHAT, len(body)) + body)
        await writer.drain()
        await _until(lambda: len(worker.generated) == 1)  # queued at the worker
    await _until(lambda: worker.cancelled == [worker.generated[0].request_id])
    await _until(lambda: access_lines)
    assert [e["status"] for e in access_lines] == [499]
    metrics = await _metrics(frontend)
    labels = {"endpoint": "chat", "model": "demo"}
    assert _count(metrics, "lorafleet_frontend_requests_total", **labels, status="499") == 1
    assert _count(metrics, "lorafleet_frontend_inflight_requests", **labels) == 0


async def test_a_client_that_hangs_up_mid_stream_cancels_it_counted_as_499(
    frontend, workers, nats_url, etcd, namespace, access_lines
) -> None:
    worker = await _start(workers, nats_url, etcd, namespace, token_delay_s=0.05)
    await wait_for_models(frontend, {"demo"})
    body = _chat(max_tokens=1000, stream=True)
    async with frontend.http.stream("POST", CHAT, json=body) as response:
        async for line in response.aiter_lines():
            if "tok1" in line:
                break
    await _until(lambda: worker.cancelled == [worker.generated[0].request_id])
    await _until(lambda: access_lines)
    assert [e["status"] for e in access_lines] == [499]
    metrics = await _metrics(frontend)
    labels = {"endpoint": "chat", "model": "demo"}
    assert _count(metrics, "lorafleet_frontend_requests_total", **labels, status="499") == 1
    assert _count(metrics, "lorafleet_frontend_requests_total", **labels, status="200") == 0
    assert _count(metrics, "lorafleet_frontend_errors_total", **labels, code="client_gone") == 1


async def test_a_client_that_hangs_up_on_a_whole_answer_is_counted_as_499(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    worker = await _start(workers, nats_url, etcd, namespace, token_delay_s=0.05)
    await wait_for_models(frontend, {"demo"})
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        await frontend.http.post(CHAT, json=_chat(max_tokens=1000), timeout=0.5)
    await _until(lambda: worker.cancelled == [worker.generated[0].request_id])
    labels = {"endpoint": "chat", "model": "demo"}
    await _until_counted(frontend, "lorafleet_frontend_requests_total", labels | {"status": "499"})


async def _until_counted(frontend: RunningFrontend, name: str, labels: dict[str, str]) -> None:
    async with asyncio.timeout(20):
        while _count(await _metrics(frontend), name, **labels) != 1:
            await asyncio.sleep(0.05)


async def test_a_body_slower_than_the_body_timeout_is_a_408_and_its_connection_closes(
    slow_body_frontend,
) -> None:
    frontend = slow_body_frontend
    async with _open(frontend) as (reader, writer):
        writer.write(_head(CHAT, 100) + b'{"model": ')
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=30)  # to EOF: it closes
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ")
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout" and "DYN_BODY_TIMEOUT_S" in error["message"]
    labels = {"endpoint": "chat", "model": ""}
    counted = _count(await _metrics(frontend), "lorafleet_frontend_requests_total",
                     **labels, status="408")  # fmt: skip
    assert counted == 1


async def test_a_body_trickling_in_parts_past_the_body_timeout_is_a_408(
    slow_body_frontend,
) -> None:
    """Each part comes well within the body timeout; the whole body does not, so the
    deadline counts from the head, not from the last part."""
    async with _open(slow_body_frontend) as (reader, writer):
        writer.write(_head(CHAT, 100))
        answer = asyncio.ensure_future(reader.read())  # to EOF: it closes
        for _ in range(100):  # a byte each 0.3 s: the body would take 30 s
            if answer.done():
                break
            writer.write(b" ")
            await writer.drain()
            await asyncio.wait([answer], timeout=0.3)
        head = (await asyncio.wait_for(answer, timeout=30)).partition(b"\r\n\r\n")[0]
    assert head.startswith(b"HTTP/1.1 408 ")


async def test_five_hundred_slow_bodies_get_408s_while_normal_traffic_is_served(
    slow_body_frontend, workers, nats_url, etcd, namespace
) -> None:
    frontend = slow_body_frontend
    await _start(workers, nats_url, etcd, namespace)
    await wait_for_models(frontend, {"demo"})
    host, port = frontend.url.removeprefix("http://").split(":")
    slow = [await asyncio.open_connection(host, int(port)) for _ in range(SLOW_BODIES)]
    for index, (_reader, writer) in enumerate(slow):
        writer.write(_head(CHAT if index % 2 else "/v1/adapters", 100) + b"{")
    statuses = []
    for _ in range(NORMAL_REQUESTS):  # one after another while the slow bodies wait
        statuses.append((await frontend.http.post(CHAT, json=_chat(max_tokens=2))).status_code)
    answers = await asyncio.gather(*(asyncio.wait_for(r.read(), 60) for r, _w in slow))
    for _reader, writer in slow:
        writer.close()
    assert statuses == [200] * NORMAL_REQUESTS
    assert {answer.split(b" ", 2)[1] for answer in answers} == {b"408"}
