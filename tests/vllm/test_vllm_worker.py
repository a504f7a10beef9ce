"""A real worker process with ``--engine vllm``: start-up order, serving over NATS, its KV
events on the fleet's subject, clean exit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import kv_events_subject
from lorafleet.launch.demo_model import DEMO_MODEL_NAME, EXPECTED, EXPECTED_PROMPT, DemoModelPaths
from lorafleet.proto.discovery import decode_card, decode_instance
from lorafleet.proto.inference import FinalChunk, KvSnapshotRequest, TokenChunk, encode_msg
from lorafleet.proto.kv_events import BlocksStored, decode_kv_batch, decode_kv_snapshot
from tests.processes import start_worker
from tests.vllm.answers import chat
from tests.worker.streaming import stream

WORKER_START_S = 240.0
"""vLLM's processes start within a minute on 2 busy cores; leave room."""


@pytest.mark.timeout(WORKER_START_S + 120)
async def test_vllm_worker_answers_over_nats_publishes_its_card_and_exits_cleanly(
    demo: DemoModelPaths, etcd: EtcdClient, etcd_url: str, nats_url: str, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    args = ("--engine", "vllm", "--served-model-name", DEMO_MODEL_NAME, "--context-length",
            "4096", "--engine-option", "enforce_eager=true")  # fmt: skip
    worker = start_worker(
        tmp_path, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace,
        model=str(demo.base), args=args, wait=False,
    )  # fmt: skip
    try:
        await asyncio.to_thread(worker.wait_ready, WORKER_START_S)
        (instance_kv,) = list(await etcd.get_prefix(f"v1/instances/{namespace}/".encode()))
        (card_kv,) = list(await etcd.get_prefix(f"v1/mdc/{namespace}/".encode()))
        assert decode_card(card_kv.value).context_length == 512  # the model's own limit
        instance = decode_instance(instance_kv.value)
        assert instance.kv_cache is not None and instance.kv_cache.tokenizer == "hf"
        client = await nats.connect(nats_url)
        try:
            chunks = await stream(
                client, instance.subject, chat(DEMO_MODEL_NAME, EXPECTED_PROMPT), 60
            )
            stored = await _stored_blocks_of_a_long_prompt(client, instance.subject, namespace)
            reply = await client.request(instance.subject, encode_msg(KvSnapshotRequest()), 30)
        finally:
            await client.close()
        assert "".join(c.text for c in chunks if isinstance(c, TokenChunk)) == EXPECTED["base"]
        assert isinstance(chunks[-1], FinalChunk)
        assert set(stored) <= set(decode_kv_snapshot(reply.data).blocks[DEMO_MODEL_NAME])
        assert await asyncio.to_thread(worker.terminate, 60) == 0
        assert list(await etcd.get_prefix(f"v1/mdc/{namespace}/".encode())) == []
    finally:
        worker.kill()


async def _stored_blocks_of_a_long_prompt(
    client: nats.aio.client.Client, subject: str, namespace: str
) -> list[int]:
    """Send a prompt longer than a block; the base model's blocks the worker then relays."""
    stored: asyncio.Queue[BlocksStored] = asyncio.Queue()

    async def on_batch(msg: nats.aio.msg.Msg) -> None:
        for event in decode_kv_batch(msg.data).events:
            if isinstance(event, BlocksStored) and event.version == DEMO_MODEL_NAME:
                await stored.put(event)

    events = await client.subscribe(kv_events_subject(namespace), cb=on_batch)
    await client.flush()
    long_prompt = " ".join(["Tell me a joke about the seven seas and a tiny robot."] * 12)
    answered = await stream(client, subject, chat(DEMO_MODEL_NAME, long_prompt, max_tokens=2), 60)
    assert isinstance(answered[-1], FinalChunk)
    event = await asyncio.wait_for(stored.get(), 60)
    await events.unsubscribe()
    return event.hashes
