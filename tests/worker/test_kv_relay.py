"""A mocker worker's KV events reach the fleet: stored blocks, hits, versions apart, snapshots.

A subscriber on the namespace's events subject stands where a frontend will; the blocks
it sees must be the fleet's hashes (``fleet.kv_blocks``) of the version the card names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import nats
import pytest

from lorafleet.discovery.keys import kv_events_subject
from lorafleet.fleet.kv_blocks import block_hashes, version_key, words_tokens
from lorafleet.proto.discovery import decode_instance
from lorafleet.proto.inference import (
    ErrorChunk,
    GenerateRequest,
    KvSnapshotRequest,
    SamplingParams,
    encode_msg,
)
from lorafleet.proto.kv_events import (
    BlocksStored,
    KvCacheSpec,
    KvEvent,
    KvEventBatch,
    VersionCleared,
    decode_kv_batch,
    decode_kv_snapshot,
)
from lorafleet.worker.kv_mirror import KvMirror
from lorafleet.worker.kv_relay import KvRelay
from tests.worker.adapters import adapter_digest, make_adapter_dir
from tests.worker.fleet import wait_for_records
from tests.worker.streaming import stream

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROMPT = " ".join(f"word{i}" for i in range(40))  # two whole blocks of 16 tokens
V1, V2 = b"\x01" * 16, b"\x02" * 16


class EventLog:
    """Every batch on the events subject, and a wait for one that satisfies a test."""

    def __init__(self) -> None:
        self.batches: list[KvEventBatch] = []
        self._arrived = asyncio.Event()

    async def on_msg(self, msg: nats.aio.msg.Msg) -> None:
        self.batches.append(decode_kv_batch(msg.data))
        self._arrived.set()

    @property
    def events(self) -> list[KvEvent]:
        return [event for batch in self.batches for event in batch.events]

    async def until(self, done: Callable[[list[KvEvent]], bool], timeout_s: float = 20) -> None:
        async with asyncio.timeout(timeout_s):
            while not done(self.events):
                self._arrived.clear()
                await self._arrived.wait()


@pytest.fixture
async def events(nc, namespace: str):
    log = EventLog()
    subscription = await nc.subscribe(kv_events_subject(namespace), cb=log.on_msg)
    await nc.flush()
    yield log
    await subscription.unsubscribe()


@pytest.fixture
def lora_worker(worker_factory, tmp_path: Path):
    env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache"),
           "DYN_SYSTEM_AUTH_TOKEN": TOKEN}  # fmt: skip
    return worker_factory("--enable-lora", env=env)


async def _instance(etcd, namespace: str):
    (kv,) = list(await etcd.get_prefix(f"v1/instances/{namespace}/".encode()))
    return decode_instance(kv.value)


async def _ask(nc, subject: str, model: str, request_id: str) -> None:
    request = GenerateRequest(request_id=request_id, model=model, prompt=PROMPT,
                              sampling=SamplingParams(max_tokens=2))  # fmt: skip
    chunks = await stream(nc, subject, request)
    assert not isinstance(chunks[-1], ErrorChunk), chunks[-1]


def _stored(version: str) -> list[int]:
    return block_hashes(words_tokens([PROMPT]), 16, version)


async def test_a_prompt_sent_twice_is_stored_once_and_hits_on_metrics_and_load_record(
    events: EventLog, lora_worker, nc, etcd, namespace: str
) -> None:
    instance = await _instance(etcd, namespace)
    assert instance.kv_cache == KvCacheSpec(block_size=16, num_blocks=2048)
    for request_id in ("first", "second"):
        await _ask(nc, instance.subject, "demo", request_id)
    stored = BlocksStored(version="demo", hashes=_stored("demo"))
    await events.until(lambda seen: stored in seen)
    assert events.events[0] == VersionCleared(version="")  # the engine starts empty
    assert [batch.seq for batch in events.batches] == list(range(1, len(events.batches) + 1))
    assert {batch.instance_id for batch in events.batches} == {instance.instance_id}
    async with httpx.AsyncClient(base_url=lora_worker.url) as http:
        metrics = (await http.get("/metrics")).text
    assert 'vllm:prefix_cache_queries_total{lora_name="",model_name="demo"} 80.0' in metrics
    assert 'vllm:prefix_cache_hits_total{lora_name="",model_name="demo"} 32.0' in metrics
    assert 'lorafleet_kv_cache_blocks{lora_name="",model_name="demo",version="demo"}' in metrics
    records = await wait_for_records(
        etcd, namespace, lambda got: any(r.prefix_cache_hits == 32 for r in got.values())
    )
    assert [r.prefix_cache_queries for r in records.values()] == [80]


async def test_versions_never_share_blocks_and_leaving_versions_are_cleared(
    events: EventLog, lora_worker, nc, etcd, namespace: str, tmp_path: Path
) -> None:
    """Two adapters, the same prompt: two chains; a swap clears the old version, an unload
    the last; a snapshot then holds exactly what the events said."""
    instance = await _instance(etcd, namespace)
    async with httpx.AsyncClient(base_url=lora_worker.url, headers=AUTH) as http:
        for name, weights in (("alpha", V1), ("beta", V1), ("alpha", V2)):
            path = make_adapter_dir(tmp_path / name / str(weights[0]), name, weights=weights)
            body = {"lora_name": name, "source": {"uri": f"file://{path}"}, "replace": True}
            loaded = await http.post("/engine/update/load_lora", json=body)
            assert loaded.status_code == 200, loaded.text
            await _ask(nc, instance.subject, name, f"{name}-{weights[0]}")
        unloaded = await http.post("/engine/update/unload_lora", json={"lora_name": "beta"})
        assert unloaded.status_code == 200, unloaded.text
    alpha1, alpha2, beta = (version_key("alpha", adapter_digest(weights=V1)),
                            version_key("alpha", adapter_digest(weights=V2)),
                            version_key("beta", adapter_digest(weights=V1)))  # fmt: skip
    await events.until(lambda seen: VersionCleared(version=beta) in seen)
    seen = events.events
    for version in (alpha1, beta, alpha2):
        assert BlocksStored(version=version, hashes=_stored(version)) in seen
    assert not set(_stored(alpha1)) & set(_stored(beta))
    assert VersionCleared(version=alpha1) in seen  # the swap's old version left
    reply = await nc.request(instance.subject, encode_msg(KvSnapshotRequest()), timeout=10)
    snapshot = decode_kv_snapshot(reply.data)
    mirror = KvMirror()
    for event in events.events:
        mirror.apply(event)
    assert snapshot.seq == events.batches[-1].seq
    assert snapshot.blocks == mirror.blocks() == {alpha2: _stored(alpha2)}


async def test_a_malformed_engine_event_is_dropped_and_the_relay_goes_on(
    nc, events: EventLog, namespace: str
) -> None:
    relay = KvRelay.start(nc, subject=kv_events_subject(namespace), instance_id=7,
                          model_name="demo")  # fmt: skip
    try:
        relay.add(BlocksStored(version="demo", hashes=["not a hash"]))  # type: ignore[list-item]
        relay.add("not an event")  # type: ignore[arg-type]
        relay.add(BlocksStored(version="demo", hashes=[1, 2]))
        await events.until(lambda seen: len(seen) == 2)
    finally:
        await relay.aclose()
    assert events.events == [
        VersionCleared(version=""),
        BlocksStored(version="demo", hashes=[1, 2]),
    ]
