"""The frontend app over real HTTP, etcd and NATS, with scripted stand-in workers.

Stand-ins (tests/frontend/stand_in.py) make failures exact: a worker that is
mute, one whose records outlive it, one that answers errors. The end-to-end
tests with real worker processes are in test_e2e.py.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from lorafleet.launch.local_servers import free_port, start_nats
from lorafleet.proto.errors import ErrorInfo
from tests.frontend.conftest import FAST_DISPATCH, run_frontend, wait_for_models
from tests.frontend.stand_in import Behaviour, StandInWorker
from tests.processes import frontend_start_failure

CHAT = "/v1/chat/completions"


def _chat(model: str = "demo", **fields: object) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "say hi"}], **fields}


async def _start(workers, nats_url, etcd, namespace, model="demo", **kwargs) -> StandInWorker:
    worker = await StandInWorker(nats_url, etcd, namespace, model, **kwargs).start()
    workers.append(worker)
    return worker


def _sse_events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (b"{not json", None, "JSON is malformed"),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', "model", "model"),
        (b'{"model": "demo", "messages": "hi"}', "messages", "Expected `array`"),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}',
         "max_tokens", ">= 1"),
        (b"", None, "body is empty"),
    ],
)  # fmt: skip
async def test_bad_input_is_400_naming_the_problem(frontend, body, param, words) -> None:
    response = await frontend.http.post(
        CHAT, content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"]
    if param:
        assert param in error["message"]


async def test_unknown_model_is_404_listing_what_is_served(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    await _start(workers, nats_url, etcd, namespace, adapters=("pirate",))
    await wait_for_models(frontend, {"demo", "pirate"})
    response = await frontend.http.post(CHAT, json=_chat("parrot"))
    assert response.status_code == 404
    error = response.json()["error"]
    assert "'parrot'" in error["message"] and "demo, pirate" in error["message"]
    assert (error["param"], error["code"]) == ("model", "not_found")
    assert (await frontend.http.get("/v1/models/parrot")).status_code == 404


async def test_models_and_one_model_by_name_including_slashes(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    await _start(workers, nats_url, etcd, namespace, adapters=("org/pirate",))
    await wait_for_models(frontend, {"demo", "org/pirate"})
    listing = (await frontend.http.get("/v1/models")).json()
    assert [(m["id"], m["parent"]) for m in listing["data"]] == [
        ("demo", None), ("org/pirate", "demo")
    ]  # fmt: skip
    one = (await frontend.http.get("/v1/models/org/pirate")).json()
    assert (one["id"], one["object"], one["root"]) == (
        "org/pirate",
        "model",
        "file:///***/pirate",  # the stand-in's file:///adapters/org/pirate, without its path
    )


async def test_a_worker_error_is_502_with_the_worker_s_message(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    await _start(workers, nats_url, etcd, namespace, behaviour=Behaviour.FAIL)
    await wait_for_models(frontend, {"demo"})
    for stream in (False, True):
        response = await frontend.http.post(CHAT, json=_chat(stream=stream))
        assert response.status_code == 502
        assert "engine exploded" in response.json()["error"]["message"]


async def test_a_worker_s_invalid_request_stays_a_400(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    error = ErrorInfo(code="invalid_request", message="prompt is longer than the context")
    await _start(workers, nats_url, etcd, namespace, behaviour=Behaviour.FAIL, error=error)
    await wait_for_models(frontend, {"demo"})
    response = await frontend.http.post(CHAT, json=_chat())
    assert response.status_code == 400
    assert "longer than the context" in response.json()["error"]["message"]


async def test_requests_to_a_mute_instance_are_retried_on_a_live_one(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    await _start(workers, nats_url, etcd, namespace, behaviour=Behaviour.MUTE)
    live = await _start(workers, nats_url, etcd, namespace)
    await wait_for_models(frontend, {"demo"})
    await _until(lambda: len(frontend.registry.get("demo").instances) == 2)
    results = await asyncio.gather(
        *(frontend.http.post(CHAT, json=_chat(max_tokens=2, stream=i % 2 == 1)) for i in range(6))
    )
    assert [r.status_code for r in results] == [200] * 6
    assert len(live.generated) == 6


async def test_records_that_outlive_their_worker_cost_no_request(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    gone = await _start(workers, nats_url, etcd, namespace)
    live = await _start(workers, nats_url, etcd, namespace)
    await _until(lambda: len((frontend.registry.get("demo") or _NONE).instances) == 2)
    await gone.stop(retract=False)  # a crash: its records stay until the lease expires
    results = [await frontend.http.post(CHAT, json=_chat(max_tokens=1)) for _ in range(4)]
    assert [r.status_code for r in results] == [200] * 4
    assert len(live.generated) == 4


async def test_no_live_instance_is_503(frontend, workers, nats_url, etcd, namespace) -> None:
    gone = await _start(workers, nats_url, etcd, namespace)
    await wait_for_models(frontend, {"demo"})
    await gone.stop(retract=False)
    response = await frontend.http.post(CHAT, json=_chat())
    assert response.status_code == 503
    assert "No live instance serves model 'demo'" in response.json()["error"]["message"]


async def test_a_worker_lost_mid_stream_ends_the_stream_with_an_error_event(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    worker = await _start(workers, nats_url, etcd, namespace, token_delay_s=0.05)
    await wait_for_models(frontend, {"demo"})
    async with frontend.http.stream("POST", CHAT, json=_chat(max_tokens=1000, stream=True)) as r:
        assert r.status_code == 200
        lines = r.aiter_lines()
        while not (await anext(lines)).startswith("data: "):
            pass
        await worker.stop(retract=False)
        rest = [line async for line in lines]
    events = [line.removeprefix("data: ") for line in rest if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "stopped answering mid-stream" in error["message"]


async def test_a_client_that_disconnects_cancels_the_request_at_the_worker(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    worker = await _start(workers, nats_url, etcd, namespace, token_delay_s=0.05)
    await wait_for_models(frontend, {"demo"})
    async with frontend.http.stream("POST", CHAT, json=_chat(max_tokens=1000, stream=True)) as r:
        async for line in r.aiter_lines():
            if "tok1" in line:
                break
    await _until(lambda: worker.cancelled == [worker.generated[0].request_id])
    await _until(lambda: frontend.app.state.services.plane.open_replies == 0)


async def test_a_client_that_hangs_up_on_a_whole_answer_cancels_it_at_the_worker(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    worker = await _start(workers, nats_url, etcd, namespace, token_delay_s=0.05)
    await wait_for_models(frontend, {"demo"})
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        await frontend.http.post(CHAT, json=_chat(max_tokens=1000), timeout=0.5)
    await _until(lambda: worker.cancelled == [worker.generated[0].request_id])
    await _until(lambda: frontend.app.state.services.plane.open_replies == 0)
    metrics = (await frontend.http.get("/metrics")).text
    assert 'code="client_gone"' in metrics


async def test_a_whole_answer_reads_the_same_from_a_worker_that_predates_gathering(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    new = await _start(workers, nats_url, etcd, namespace, model="new")
    old = await _start(workers, nats_url, etcd, namespace, model="old", gathers=False)
    await wait_for_models(frontend, {"new", "old"})
    answers = {}
    for model in ("new", "old"):
        response = await frontend.http.post(CHAT, json=_chat(model, max_tokens=4))
        assert response.status_code == 200, response.text
        body = response.json()
        answers[model] = (body["choices"], body["usage"])
    assert new.generated[0].whole and not old.generated[0].whole  # old: streamed it
    assert answers["new"] == answers["old"]
    message = answers["new"][0][0]["message"]
    assert message["content"] == "tok0 tok1 tok2 tok3"
    assert answers["new"][1] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    text = (await frontend.http.get("/metrics")).text
    for model in ("new", "old"):
        first_tokens = f'time_to_first_token_seconds_count{{endpoint="chat",model="{model}"}} 1.0'
        assert first_tokens in text


async def test_a_whole_answer_slower_than_the_stall_timeout_comes_whole_and_once(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    # 8 tokens of 0.1 s: the one reply message comes after 0.8 s, the stall timeout is 0.3 s
    worker = await _start(workers, nats_url, etcd, namespace, token_delay_s=0.1)
    await wait_for_models(frontend, {"demo"})
    response = await frontend.http.post(CHAT, json=_chat(max_tokens=8))
    assert response.status_code == 200
    content = response.json()["choices"][0]["message"]["content"]
    assert content == " ".join(f"tok{i}" for i in range(8))
    assert len(worker.generated) == 1  # the silent worker answered the pings: no retry


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_whose_final_chunk_crosses_the_ping_is_served_not_503(
    frontend, workers, nats_url, etcd, namespace, stream
) -> None:
    # The engine is silent past the stall timeout, so the frontend pings about the request;
    # the final chunk goes out just before the worker answers that ping with 404 (the request
    # has just ended). The answer had arrived: the client gets it, not "No live instance".
    worker = await _start(workers, nats_url, etcd, namespace, final_on_ping=True)
    await wait_for_models(frontend, {"demo"})
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)
    async with client:
        request = {"model": "demo", "messages": [{"role": "user", "content": "say hi"}]}
        if stream:
            chunks = await client.chat.completions.create(**request, max_tokens=3, stream=True)
            parts = [c.choices[0].delta.content or "" async for c in chunks if c.choices]
            text = "".join(parts)
        else:
            answer = await client.chat.completions.create(**request, max_tokens=3)
            text = answer.choices[0].message.content or ""
    assert text == "tok0 tok1 tok2"
    assert len(worker.generated) == 1  # served once, not retried elsewhere


async def test_stream_carries_role_tokens_finish_and_usage(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    await _start(workers, nats_url, etcd, namespace)
    await wait_for_models(frontend, {"demo"})
    body = _chat(max_tokens=3, stream=True, stream_options={"include_usage": True})
    response = await frontend.http.post(CHAT, json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "tok0 tok1 tok2"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


async def test_metrics_count_requests_errors_and_first_tokens_per_model(
    frontend, workers, nats_url, etcd, namespace
) -> None:
    await _start(workers, nats_url, etcd, namespace)
    await wait_for_models(frontend, {"demo"})
    await frontend.http.post(CHAT, json=_chat(max_tokens=2))
    await frontend.http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    text = (await frontend.http.get("/metrics")).text
    assert (
        'lorafleet_frontend_requests_total{endpoint="chat",model="demo",status="200"} 1.0' in text
    )
    assert (
        'lorafleet_frontend_errors_total{code="not_found",endpoint="completions",model=""} 1.0'
        in text
    )
    assert (
        'lorafleet_frontend_time_to_first_token_seconds_count{endpoint="chat",model="demo"} 1.0'
        in text
    )
    assert (
        'lorafleet_frontend_request_duration_seconds_count{endpoint="chat",model="demo"} 1.0'
        in text
    )


async def test_health_and_openapi(frontend) -> None:
    health = await frontend.http.get("/health")
    assert (health.status_code, health.json()["status"]) == (200, "healthy")
    schema = (await frontend.http.get("/openapi.json")).json()
    operations = {op["operationId"] for path in schema["paths"].values() for op in path.values()}
    assert {"createChatCompletion", "createCompletion", "listModels", "retrieveModel"} <= operations
    request = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert "messages" in request["required"]


class _NoModel:
    instances = ()


_NONE = _NoModel()


async def _until(condition, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def test_health_follows_the_nats_connection(etcd_url, namespace, tmp_path) -> None:
    own_nats = start_nats(tmp_path / "nats")
    config = FrontendConfig(namespace=namespace,
                            etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=own_nats.url, dispatch=FAST_DISPATCH)  # fmt: skip
    try:
        async with run_frontend(config) as frontend:
            own_nats.stop()
            await _until_status(frontend, 503)
            await asyncio.to_thread(own_nats.restart)
            await _until_status(frontend, 200)
    finally:
        own_nats.stop()


def test_unreachable_etcd_stops_the_frontend_with_one_clear_line(nats_url) -> None:
    etcd_port = free_port()  # nothing listens there
    stderr = frontend_start_failure({
        "ETCD_ENDPOINTS": f"http://127.0.0.1:{etcd_port}", "NATS_SERVER": nats_url,
        "DYN_CONNECT_TIMEOUT_S": "2",
    })  # fmt: skip
    assert "frontend cannot start" in stderr
    assert "gave up on etcd" in stderr and "DYN_CONNECT_TIMEOUT_S" in stderr
    assert f"etcd at http://127.0.0.1:{etcd_port} is unavailable" in stderr
    assert "ETCD_ENDPOINTS" in stderr  # what to check


async def _until_status(frontend, status: int) -> None:
    async with asyncio.timeout(10):
        while (await frontend.http.get("/health")).status_code != status:
            await asyncio.sleep(0.05)


async def test_two_frontends_side_by_side_serve_the_same_fleet(
    frontend, workers, nats_url, etcd_url, etcd, namespace
) -> None:
    worker = await _start(workers, nats_url, etcd, namespace)
    config = FrontendConfig(
        namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url), nats_server=nats_url
    )
    async with run_frontend(config) as other:
        for running in (frontend, other):
            await wait_for_models(running, {"demo"})
            response = await running.http.post(CHAT, json=_chat(max_tokens=2))
            assert response.json()["choices"][0]["message"]["content"] == "tok0 tok1"
    assert len(worker.generated) == 2
