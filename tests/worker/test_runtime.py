"""A real mocker worker on real etcd and NATS: start-up, serving, shutdown, crashes."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import socket
import time
import urllib.error
import urllib.request

import msgspec
import pytest

from lorafleet.discovery.keys import base_card_key, instance_key
from lorafleet.launch.local_servers import free_port
from lorafleet.proto.discovery import decode_card, decode_instance
from lorafleet.proto.inference import (
    CancelRequest,
    ErrorChunk,
    FinalChunk,
    GenerateRequest,
    PingRequest,
    SamplingParams,
    TokenChunk,
    decode_chunk,
    encode_msg,
)
from lorafleet.worker.status_server import MAX_BODY_BYTES
from tests.processes import ServiceProcess, start_worker
from tests.stuck_clients import (
    EXIT_MARGIN_S,
    closed_by_server,
    exits_within_grace_despite_stuck_clients_and_hung_etcd,
    served_after,
    stop_by_signal,
)
from tests.worker.nats_late import worker_waits_for_late_nats
from tests.worker.streaming import stream


async def _instance(etcd, namespace: str):
    listing = await etcd.get_prefix(f"v1/instances/{namespace}/".encode())
    (kv,) = list(listing)
    return decode_instance(kv.value)


async def _keys(etcd, namespace: str) -> list[str]:
    keys = []
    for root in ("v1/instances/", "v1/mdc/"):
        keys += [kv.key.decode() for kv in await etcd.get_prefix(f"{root}{namespace}/".encode())]
    return keys


async def _streaming(
    worker_factory, etcd, nc, namespace: str, *, max_tokens: int
) -> tuple[ServiceProcess, asyncio.Task[list]]:
    """A slow mocker worker (50 ms a token) and a streamed request that has its first token."""
    worker = worker_factory("--mocker-time-per-token-s", "0.05")
    instance = await _instance(etcd, namespace)
    sampling = SamplingParams(max_tokens=max_tokens)
    request = GenerateRequest(request_id="r", model="demo", sampling=sampling)
    first_token = asyncio.Event()
    pending = asyncio.create_task(stream(nc, instance.subject, request, on_chunk=first_token.set))
    await first_token.wait()
    return worker, pending


def _metric(worker: ServiceProcess, line_start: str) -> float:
    with urllib.request.urlopen(f"{worker.url}/metrics") as response:
        text = response.read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(line_start)]
    return sum(values)


async def test_worker_publishes_instance_and_base_card_under_design_keys(
    worker_factory, etcd, namespace
):
    worker_factory("--served-model-name", "tiny")
    instance = await _instance(etcd, namespace)
    assert instance.subject == f"{namespace}.backend.generate-{instance.instance_id:x}"
    assert instance.engine == "mocker"
    key = instance_key(namespace, "backend", "generate", instance.instance_id)
    assert (await etcd.get(key.encode())).lease == instance.instance_id
    card_raw = await etcd.get(
        base_card_key(namespace, "backend", "generate", instance.instance_id).encode()
    )
    card = decode_card(card_raw.value)
    assert card.display_name == "tiny" and card.lora is None
    assert not card.runtime_config.enable_lora  # no LoRA management on this worker
    assert b'\n  "display_name": "tiny"' in card_raw.value  # readable through etcdctl


async def test_request_streams_the_asked_number_of_tokens(worker_factory, etcd, nc, namespace):
    worker_factory()
    instance = await _instance(etcd, namespace)
    request = GenerateRequest(
        request_id="r1", model="demo", prompt="one two three", sampling=SamplingParams(max_tokens=7)
    )
    chunks = await stream(nc, instance.subject, request)
    tokens = [chunk for chunk in chunks if isinstance(chunk, TokenChunk)]
    assert [t.text for t in tokens] == [f"demo:{i} " for i in range(7)]
    final = chunks[-1]
    assert isinstance(final, FinalChunk) and final.finish_reason == "length"
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (3, 7)


async def test_a_whole_request_is_answered_in_one_message_with_every_token(
    worker_factory, etcd, nc, namespace
):
    worker = worker_factory()
    instance = await _instance(etcd, namespace)
    sampling = SamplingParams(max_tokens=3, logprobs=1)
    streamed = await stream(
        nc, instance.subject, GenerateRequest(request_id="s", model="demo", sampling=sampling)
    )
    request = GenerateRequest(request_id="w", model="demo", sampling=sampling, whole=True)
    (final,) = await stream(nc, instance.subject, request)
    assert isinstance(final, FinalChunk) and final.answer is not None
    tokens = [chunk for chunk in streamed if isinstance(chunk, TokenChunk)]
    assert final.answer.text == "demo:0 demo:1 demo:2 " == "".join(t.text for t in tokens)
    assert final.answer.token_ids == [0, 1, 2]
    assert final.answer.logprobs == [logprob for t in tokens for logprob in t.logprobs]
    assert (final.finish_reason, final.usage) == (streamed[-1].finish_reason, streamed[-1].usage)
    assert _metric(worker, 'lorafleet_worker_generated_tokens_total{model="demo"}') == 6


async def test_unknown_model_reaches_the_caller_as_an_error_chunk(
    worker_factory, etcd, nc, namespace
):
    worker_factory()
    instance = await _instance(etcd, namespace)
    chunks = await stream(nc, instance.subject, GenerateRequest(request_id="r", model="nope"))
    assert len(chunks) == 1 and isinstance(chunks[0], ErrorChunk)
    assert chunks[0].error.code == "not_found" and "'nope'" in chunks[0].error.message


async def test_a_message_nested_too_deeply_is_answered_as_invalid(
    worker_factory, etcd, nc, namespace
):
    """A tool's msgpack update nested 10,000 levels deep: an error reply, and the worker lives."""
    worker_factory()
    instance = await _instance(etcd, namespace)
    head = msgspec.msgpack.encode({"kind": "update", "name": "list_loras"})
    deep = b"\x91" * 10_000 + b"\xc0"  # [[[...[nil]...]]] in msgpack
    body = msgspec.msgpack.encode("body") + b"\x81" + msgspec.msgpack.encode("x") + deep
    data = b"\x83" + head[1:] + body  # the two fields of ``head``, then ``body``: three
    reply = decode_chunk((await nc.request(instance.subject, data, timeout=10)).data)
    assert isinstance(reply, ErrorChunk) and reply.error.code == "invalid_request"
    chunks = await stream(nc, instance.subject, GenerateRequest(request_id="r", model="demo"))
    assert isinstance(chunks[-1], FinalChunk)


async def test_cancel_stops_generation_at_the_worker(worker_factory, etcd, nc, namespace):
    worker = worker_factory("--mocker-time-per-token-s", "0.05")
    instance = await _instance(etcd, namespace)
    inbox = nc.new_inbox()
    received: list[bytes] = []
    first_chunk = asyncio.Event()

    async def on_chunk(msg) -> None:
        received.append(msg.data)
        first_chunk.set()

    await nc.subscribe(inbox, cb=on_chunk)
    request = GenerateRequest(
        request_id="long", model="demo", sampling=SamplingParams(max_tokens=60)
    )
    await nc.publish(instance.subject, encode_msg(request), reply=inbox)
    await first_chunk.wait()
    await nc.publish(instance.subject, encode_msg(CancelRequest(request_id="long")))
    cancelled = 'lorafleet_worker_requests_total{model="demo",outcome="cancelled"}'
    await _wait_for_metric(worker, cancelled, 1)  # the generation task has ended
    await nc.request(instance.subject, encode_msg(PingRequest()), timeout=10)  # chunks in
    assert len(received) < 20  # 60 tokens asked for; none after the cancel
    assert not any(isinstance(decode_chunk(data), FinalChunk) for data in received)


async def test_sigterm_finishes_inflight_request_then_removes_keys(
    worker_factory, etcd, nc, namespace
):
    worker, pending = await _streaming(worker_factory, etcd, nc, namespace, max_tokens=20)
    exit_code = await asyncio.to_thread(worker.terminate)
    chunks = await pending
    assert exit_code == 0
    assert isinstance(chunks[-1], FinalChunk) and chunks[-1].usage.completion_tokens == 20
    assert await _keys(etcd, namespace) == []


async def _wait_for_metric(worker: ServiceProcess, line_start: str, value: float) -> None:
    """Poll ``/metrics`` until the sum of the lines starting ``line_start`` reaches ``value``."""
    async with asyncio.timeout(10):
        while await asyncio.to_thread(_metric, worker, line_start) < value:
            await asyncio.sleep(0.05)


async def test_sigkill_keys_vanish_within_ttl(worker_factory, etcd, namespace):
    worker = worker_factory()
    assert len(await _keys(etcd, namespace)) == 2
    worker.kill()
    async with asyncio.timeout(2 + 1):  # DYN_LEASE_TTL=2 in tests.processes
        while await _keys(etcd, namespace):
            await asyncio.sleep(0.05)


async def test_failing_on_endpoint_ready_exits_nonzero_and_leaves_nothing(
    worker_factory, etcd, namespace
):
    worker = worker_factory("--engine-option", "fail_on_endpoint_ready=true", wait=False)
    exit_code = await asyncio.to_thread(worker.process.wait, 30)
    assert exit_code != 0
    assert "on_endpoint_ready failed" in worker.log_tail()
    assert await _keys(etcd, namespace) == []


async def test_engine_routes_answer_503_until_on_endpoint_ready_returned(worker_factory):
    worker = worker_factory("--engine-option", "endpoint_ready_delay_s=3", wait=False)
    status = await asyncio.to_thread(_post_status, worker, "/engine/update/list_loras", b"{}", 10)
    assert status == 503
    await asyncio.to_thread(worker.wait_ready)
    assert await asyncio.to_thread(_post_status, worker, "/engine/update/list_loras", b"{}") == 404


def _post_status(worker: ServiceProcess, path: str, body: bytes, wait_s: float = 0) -> int:
    """POST and return the status; retry connection errors for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            request = urllib.request.Request(f"{worker.url}{path}", data=body, method="POST")
            with urllib.request.urlopen(request) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'"a string"', 400, "must be a JSON object"),
    ],
)
async def test_status_server_answers_bad_bodies_with_4xx(worker_factory, body, status, says):
    worker = worker_factory()
    request = urllib.request.Request(
        f"{worker.url}/engine/update/load_lora", data=body, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        await asyncio.to_thread(urllib.request.urlopen, request)
    assert caught.value.code == status
    assert says in caught.value.read().decode()


async def test_status_server_refuses_an_oversized_body_from_its_length(worker_factory):
    """413 before the body is read. The test sends only the head: sending 2 MiB as well
    raced the server's close after its answer (a broken pipe on a loaded machine)."""
    worker = worker_factory()
    connection = http.client.HTTPConnection("127.0.0.1", worker.port, timeout=10)
    connection.putrequest("POST", "/engine/update/load_lora")
    connection.putheader("Content-Length", str(2 * MAX_BODY_BYTES))
    connection.endheaders()
    response = await asyncio.to_thread(connection.getresponse)
    assert response.status == 413
    assert "too large" in response.read().decode()
    connection.close()


def _json_lines(worker: ServiceProcess) -> list[dict]:
    """Every line of the worker's log as a JSON object (fails on any line that is not)."""
    return [json.loads(line) for line in worker.log_path.read_text().splitlines()]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_worker_waiting_for_nats_logs_json_once_and_stops_at_a_signal(worker_factory, signum):
    down = f"nats://127.0.0.1:{free_port()}"
    worker = worker_factory(env={"NATS_SERVER": down, "LOG_FORMAT": "json"}, wait=False)
    worker.wait_for_log("waiting for NATS")
    code, took_s = stop_by_signal(worker, grace_s=0, signum=signum)
    assert code == 0 and took_s < EXIT_MARGIN_S
    events = [line["event"] for line in _json_lines(worker)]
    assert events == ["waiting for NATS", "stopped during start-up"]


def test_worker_gives_up_on_nats_after_the_connect_timeout(worker_factory):
    down = f"nats://127.0.0.1:{free_port()}"
    env = {"NATS_SERVER": down, "LOG_FORMAT": "json", "DYN_CONNECT_TIMEOUT_S": "3"}
    worker = worker_factory(env=env, wait=False)
    assert worker.process.wait(30) == 1
    lines = _json_lines(worker)  # about ten attempts, two lines, all JSON, no traceback
    assert [line["event"] for line in lines] == ["waiting for NATS", "worker failed"]
    assert lines[0]["url"] == down and "Connection refused" in lines[0]["reason"]
    assert "gave up on NATS" in lines[1]["error"] and "NATS_SERVER" in lines[1]["error"]


def test_sigterm_with_stuck_clients_and_hung_etcd_exits_within_grace(tmp_path, nats_url, own_etcd):
    worker = start_worker(
        tmp_path, etcd_url=own_etcd.url, nats_url=nats_url, namespace="stuck",
        args=("--shutdown-grace", "2"), env={"LOG_FORMAT": "json"},
    )  # fmt: skip
    exits_within_grace_despite_stuck_clients_and_hung_etcd(
        worker, own_etcd, grace_s=2, slow_path="/engine/update/list_loras", stopping="shutting down"
    )


async def test_load_lora_while_stopping_answers_503_shutting_down(
    worker_factory, etcd, nc, namespace
):
    worker, pending = await _streaming(worker_factory, etcd, nc, namespace, max_tokens=60)
    worker.process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(10):
        while await asyncio.to_thread(_get_status, worker, "/health") != 503:
            await asyncio.sleep(0.05)
    request_body = b'{"lora_name": "pirate", "source": {"uri": "file:///nowhere"}}'
    status, body = await asyncio.to_thread(_post, worker, "/engine/update/load_lora", request_body)
    assert status == 503 and body["code"] == "shutting_down"
    assert "shutting down" in body["message"]
    assert isinstance((await pending)[-1], FinalChunk)  # the drain still finished it


def _get_status(worker: ServiceProcess, path: str) -> int:
    try:
        with urllib.request.urlopen(f"{worker.url}{path}") as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _post(worker: ServiceProcess, path: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(f"{worker.url}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_status_connections_without_a_request_head_are_closed(worker_factory):
    worker = worker_factory("--header-timeout-s", "1")
    silent = socket.create_connection(("127.0.0.1", worker.port), timeout=20)
    half = socket.create_connection(("127.0.0.1", worker.port), timeout=20)
    half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line: never complete
    assert closed_by_server(silent) and closed_by_server(half)
    served_after(worker)  # complete requests are still answered


def test_worker_waits_for_nats_that_comes_up_late(tmp_path, etcd_url):
    worker_waits_for_late_nats(tmp_path, etcd_url, down_s=3)
