"""Stream migration on the hf demo model: a migrated greedy answer is the unmigrated one, exactly.

A real ``python -m lorafleet.frontend`` and a real hf worker on the demo model serve the
answers. The victim is a stand-in (``DyingRelay``): a real hf worker cannot be
killed between two of its tokens here, since the demo model answers in about
10 ms. The relay forwards the request to the real worker, passes its first
chunks on unchanged (text and token ids), then unsubscribes, as a worker
SIGKILLed mid-stream leaves its subject without a responder. The frontend must
continue on the real worker, from the token ids the client already received.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.nats_connection import NatsConnection
from lorafleet.discovery.nats_settings import NatsSettings
from lorafleet.frontend.request_plane import RequestPlane
from lorafleet.launch.demo_model import DEMO_MODEL_NAME, EXPECTED, EXPECTED_PROMPT, DemoModelPaths
from lorafleet.proto.discovery import decode_instance
from lorafleet.proto.inference import FinalChunk, GenerateRequest, TokenChunk, decode_chunk
from lorafleet.worker.engine import EngineConfig
from tests.frontend.stand_in import ScriptedEngine, StandInWorker
from tests.processes import ServiceProcess, start_frontend, start_worker

pytestmark = pytest.mark.slow

CHUNKS_BEFORE_DYING = 3
REPLY_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 15.0


class RelayEngine(ScriptedEngine):
    """Passes on a real worker's first chunks, then makes its stand-in vanish from NATS."""

    def __init__(self, config: EngineConfig, relay: DyingRelay) -> None:
        super().__init__(config, error=None, token_delay_s=0.0)
        self._relay = relay

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | FinalChunk]:
        self.generated.append(request)
        settings = NatsSettings(servers=(self._relay.nats_url,))
        conn = await NatsConnection.connect(settings, name="relay")
        plane = await RequestPlane.start(conn)
        relayed = msgspec.structs.replace(request, request_id=f"{request.request_id}-relayed")
        answer = await plane.open(self._relay.real_subject, relayed)
        for _ in range(CHUNKS_BEFORE_DYING):
            msg = await answer.next(REPLY_TIMEOUT_S)
            assert msg is not None, "the real worker did not answer the relay"
            chunk = decode_chunk(msg.data)
            assert isinstance(chunk, TokenChunk)
            yield chunk
        answer.close()
        await plane.aclose()
        await conn.aclose()
        await self._relay.nc.flush()
        await self._relay.endpoint.stop_accepting()  # dead: nobody answers its subject any more
        await asyncio.Event().wait()  # and sends nothing more; stop() cancels this


class DyingRelay(StandInWorker):
    """Serves the model with a real worker's first chunks, then vanishes from NATS."""

    real_subject = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.engine = RelayEngine(self.engine.config, self)


@pytest.fixture
def processes(
    demo: DemoModelPaths, tmp_path: Path, etcd_url: str, nats_url: str, namespace: str
) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    worker = start_worker(
        tmp_path, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace,
        model=str(demo.base), args=("--engine", "hf", "--served-model-name", DEMO_MODEL_NAME),
    )  # fmt: skip
    frontend = start_frontend(
        tmp_path, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace,
        args=("--stall-timeout-s", "0.5"),
    )  # fmt: skip
    try:
        yield worker, frontend
    finally:
        worker.kill()
        frontend.kill()


def _instances(frontend: ServiceProcess) -> int:
    return int(httpx.get(f"{frontend.url}/health").json()["instances"])


def _migrations(frontend: ServiceProcess) -> float:
    text = httpx.get(f"{frontend.url}/metrics").text
    pattern = rf'lorafleet_frontend_stream_migrations_total{{model="{DEMO_MODEL_NAME}"}} (\S+)'
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


async def _streamed(client: openai.AsyncOpenAI, **request: object) -> tuple[str, object]:
    text, usage = "", None
    stream = await client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    )
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    return text, usage


async def test_a_migrated_greedy_answer_is_the_unmigrated_one(
    processes: tuple[ServiceProcess, ServiceProcess],
    etcd: EtcdClient,
    nats_url: str,
    namespace: str,
) -> None:
    _worker, frontend = processes
    (record,) = list(await etcd.get_prefix(f"v1/instances/{namespace}/".encode()))
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)
    request = {"model": DEMO_MODEL_NAME, "max_tokens": 64, "temperature": 0,
               "messages": [{"role": "user", "content": EXPECTED_PROMPT}]}  # fmt: skip
    whole = await client.chat.completions.create(**request)
    assert whole.choices[0].message.content == EXPECTED["base"]
    relay = DyingRelay(nats_url, etcd, namespace, DEMO_MODEL_NAME)
    relay.real_subject = decode_instance(record.value).subject
    await relay.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while _instances(frontend) != 2:  # the frontend sees the relay
            assert time.monotonic() < deadline, "the frontend never counted the relay"
            await relay.nc.flush()
        # Round robin: one of two streams goes to the relay once the frontend has its card
        # (a moment after its instance record); each stream must read the same.
        for _ in range(4):
            text, usage = await _streamed(client, **request)
            assert text == EXPECTED["base"]
            assert usage.prompt_tokens == whole.usage.prompt_tokens
            assert usage.completion_tokens == whole.usage.completion_tokens
            if relay.generated:
                break
        assert relay.generated, "no stream went to the relay"
        assert _migrations(frontend) == 1
    finally:
        await relay.stop(retract=True)
        await client.close()
