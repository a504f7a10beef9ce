"""The load record's ``in_flight`` is the worker's one count of requests being served (the
endpoint's): base-model requests included, the number the worker's gauge shows, and back to
0 when they end."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import nats.aio.msg

from lorafleet.proto.discovery import decode_instance
from lorafleet.proto.inference import CancelRequest, GenerateRequest, SamplingParams, encode_msg
from tests.processes import ServiceProcess
from tests.worker.fleet import wait_for_records

GAUGE = "lorafleet_worker_inflight_requests "


def _gauge(worker: ServiceProcess) -> float:
    with urllib.request.urlopen(f"{worker.url}/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    (line,) = [line for line in lines if line.startswith(GAUGE)]
    return float(line.split()[-1])


async def test_a_base_request_in_flight_is_counted_once_in_the_load_record_and_the_gauge(
    worker_factory, etcd, nc, namespace: str, tmp_path: Path
) -> None:
    env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
    worker = worker_factory("--enable-lora", "--mocker-time-per-token-s", "0.5", env=env)
    (kv,) = list(await etcd.get_prefix(f"v1/instances/{namespace}/".encode()))
    subject = decode_instance(kv.value).subject
    first_token = asyncio.Event()

    async def on_chunk(_: nats.aio.msg.Msg) -> None:
        first_token.set()

    inbox = nc.new_inbox()
    await nc.subscribe(inbox, cb=on_chunk)
    request = GenerateRequest(request_id="long", model="demo",
                              sampling=SamplingParams(max_tokens=1000))  # fmt: skip
    await nc.publish(subject, encode_msg(request), reply=inbox)
    async with asyncio.timeout(30):
        await first_token.wait()

    await wait_for_records(etcd, namespace, lambda r: [x.in_flight for x in r.values()] == [1], 30)
    assert await asyncio.to_thread(_gauge, worker) == 1

    await nc.publish(subject, encode_msg(CancelRequest(request_id="long")))
    await wait_for_records(etcd, namespace, lambda r: [x.in_flight for x in r.values()] == [0], 30)
    assert await asyncio.to_thread(_gauge, worker) == 0
