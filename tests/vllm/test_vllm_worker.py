"""A real worker process with ``--engine vllm``: start-up order, serving over NATS, clean exit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest

from lorafleet.discovery.client import EtcdClient
from lorafleet.launch.demo_model import DEMO_MODEL_NAME, EXPECTED, EXPECTED_PROMPT, DemoModelPaths
from lorafleet.proto.discovery import decode_card, decode_instance
from lorafleet.proto.inference import FinalChunk, TokenChunk
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
        client = await nats.connect(nats_url)
        try:
            subject = decode_instance(instance_kv.value).subject
            chunks = await stream(client, subject, chat(DEMO_MODEL_NAME, EXPECTED_PROMPT), 60)
        finally:
            await client.close()
        assert "".join(c.text for c in chunks if isinstance(c, TokenChunk)) == EXPECTED["base"]
        assert isinstance(chunks[-1], FinalChunk)
        assert await asyncio.to_thread(worker.terminate, 60) == 0
        assert list(await etcd.get_prefix(f"v1/mdc/{namespace}/".encode())) == []
    finally:
        worker.kill()
