"""The hf engine inside a real worker process: adapters loaded over HTTP, requests over NATS.

One worker serves the module (starting one loads the demo model: seconds); each test
loads adapters of its own names, within the worker's 4 slots whatever the order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import nats
import pytest

from lorafleet.discovery.client import EtcdClient
from lorafleet.launch.demo_model import DEMO_MODEL_NAME, EXPECTED, EXPECTED_PROMPT, DemoModelPaths
from lorafleet.proto.discovery import decode_instance
from lorafleet.proto.inference import (
    ChatMessage,
    ErrorChunk,
    FinalChunk,
    GenerateRequest,
    SamplingParams,
    TokenChunk,
)
from tests.processes import ServiceProcess, start_worker
from tests.worker.streaming import stream

pytestmark = pytest.mark.slow

NAMESPACE = "hfworker"


@pytest.fixture(scope="module")
def worker(
    demo: DemoModelPaths, etcd_url: str, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """An hf worker serving the demo model with LoRA on, in namespace ``NAMESPACE``."""
    log_dir = tmp_path_factory.mktemp("hf-worker")
    worker = start_worker(
        log_dir, etcd_url=etcd_url, nats_url=nats_url, namespace=NAMESPACE,
        model=str(demo.base),
        args=("--engine", "hf", "--served-model-name", DEMO_MODEL_NAME, "--enable-lora"),
        env={"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(log_dir / "loras")},
    )  # fmt: skip
    yield worker
    worker.terminate()


async def _subject(etcd: EtcdClient) -> str:
    (instance_kv,) = list(await etcd.get_prefix(f"v1/instances/{NAMESPACE}/".encode()))
    return decode_instance(instance_kv.value).subject


def _chat(model: str) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"chat-{model}",
        model=model,
        messages=[ChatMessage(role="user", content=EXPECTED_PROMPT)],
        sampling=SamplingParams(max_tokens=64, temperature=0.0),
    )


def _text(chunks: list) -> str:
    assert isinstance(chunks[-1], FinalChunk), chunks[-1]
    return "".join(c.text for c in chunks if isinstance(c, TokenChunk))


async def test_hf_worker_serves_base_and_adapters_it_loaded(
    demo: DemoModelPaths, worker: ServiceProcess, etcd, nc: nats.aio.client.Client
) -> None:
    subject = await _subject(etcd)
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:
        for name, path in demo.adapters.items():
            body = {"lora_name": name, "source": {"uri": f"file://{path}"}}
            response = await client.post("/engine/update/load_lora", json=body)
            assert response.status_code == 200, response.text
        models = [DEMO_MODEL_NAME, "pirate", "robot"]
        answers = await asyncio.gather(*(stream(nc, subject, _chat(m)) for m in models))
        assert [_text(chunks) for chunks in answers] == [
            EXPECTED["base"], EXPECTED["pirate"], EXPECTED["robot"]
        ]  # fmt: skip
        response = await client.post("/engine/update/unload_lora", json={"lora_name": "robot"})
        assert response.status_code == 200, response.text
    gone = await stream(nc, subject, _chat("robot"))
    assert isinstance(gone[-1], ErrorChunk) and gone[-1].error.code == "not_found"


async def test_hf_worker_swaps_pirate_weights_for_robot_without_a_failed_request(
    demo: DemoModelPaths, worker: ServiceProcess, etcd, nc: nats.aio.client.Client
) -> None:
    """``fx`` is loaded from the pirate folder and swapped in place (vLLM's ``load_inplace``)
    for the robot folder while a client loops on it: every answer is the pirate's or the
    robot's, none fails, and once the swap has answered every answer is the robot's."""
    subject = await _subject(etcd)
    answers: list[str] = []
    swapped = asyncio.Event()
    after_swap: list[str] = []

    async def client_loop() -> None:
        while len(after_swap) < 3:
            text = _text(await stream(nc, subject, _chat("fx"), timeout_s=60))
            (after_swap if swapped.is_set() else answers).append(text)

    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as client:
        body = {"lora_name": "fx", "lora_path": str(demo.adapters["pirate"])}
        assert (await client.post("/v1/load_lora_adapter", json=body)).status_code == 200
        loop = asyncio.create_task(client_loop())
        while not answers:
            await asyncio.sleep(0.05)
        body = {"lora_name": "fx", "lora_path": str(demo.adapters["robot"]),
                "load_inplace": True}  # fmt: skip
        response = await client.post("/v1/load_lora_adapter", json=body)
        swapped.set()  # requests sent from here on went after the switch
        assert response.status_code == 200, response.text
        await asyncio.wait_for(loop, 120)
    assert answers[0] == EXPECTED["pirate"]
    assert set(answers) <= {EXPECTED["pirate"], EXPECTED["robot"]}
    assert after_swap[1:] == [EXPECTED["robot"]] * 2  # the first may have started before
