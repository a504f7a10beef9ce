"""Fleet-wide swaps through the frontend's vLLM route, with a client chatting through it.

Real etcd, NATS, two mocker worker processes and a frontend: vLLM's ``POST
/v1/load_lora_adapter`` with ``load_inplace`` declares the new source for every instance,
each worker swaps make-before-break, and the answer is the workers' outcome. A swap that
fails must answer the error and leave the old version serving everywhere: the client
looping through the frontend sees no error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import nats
import openai
import pytest

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from lorafleet.launch.demo_model import DEMO_MODEL_NAME, EXPECTED, EXPECTED_PROMPT, DemoModelPaths
from lorafleet.proto.discovery import decode_instance
from lorafleet.proto.inference import (
    ChatMessage,
    FinalChunk,
    GenerateRequest,
    SamplingParams,
    TokenChunk,
)
from tests.frontend.chat_loop import ChatLoop
from tests.frontend.conftest import FAST_DISPATCH, RunningFrontend, run_frontend, wait_for_models
from tests.processes import ServiceProcess, start_worker
from tests.worker.adapters import adapter_digest, make_adapter_dir
from tests.worker.streaming import stream

pytestmark = pytest.mark.slow

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WAIT_S = 60.0


@pytest.fixture
async def admin_frontend(etcd_url: str, nats_url: str, namespace: str
                         ) -> AsyncIterator[RunningFrontend]:  # fmt: skip
    etcd = EtcdSettings.from_endpoints(etcd_url)
    config = FrontendConfig(namespace=namespace, etcd=etcd, nats_server=nats_url,
                            dispatch=FAST_DISPATCH, admin_token=TOKEN)  # fmt: skip
    async with run_frontend(config) as running:
        yield running


async def holders(frontend: RunningFrontend, name: str, count: int, source: str = "") -> None:
    """Wait until ``count`` live instances have adapter ``name``'s card (from ``source``,
    when given)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            served = frontend.registry.get(name)
            instances = served.instances if served is not None else ()
            cards = [frontend.registry.card_on(name, i.instance_id) for i in instances]
            if len(cards) == count and all(card and source in card.source for card in cards):
                return
            await asyncio.sleep(0.05)


def worker_digests(worker: ServiceProcess) -> dict[str, str]:
    """What the worker's engine holds: adapter name to the digest of its serving version."""
    reply = httpx.post(f"{worker.url}/engine/update/list_loras", json={}, timeout=30)
    digests: dict[str, str] = reply.json()["digests"]
    return digests


async def test_a_failed_fleet_wide_load_inplace_answers_its_error_and_the_old_version_serves_on(
    lora_workers, admin_frontend: RunningFrontend, tmp_path: Path
) -> None:
    workers = await asyncio.to_thread(lora_workers, 2)
    await wait_for_models(admin_frontend, {"demo"}, timeout_s=30)
    http = admin_frontend.http
    good = {"lora_name": "fx", "lora_path": str(make_adapter_dir(tmp_path / "v1", "fx"))}
    loaded = await http.post("/v1/load_lora_adapter", json=good, headers=AUTH, timeout=WAIT_S)
    assert loaded.status_code == 200, loaded.text
    await holders(admin_frontend, "fx", 2)  # replicas "all": placement adds the second copy
    bad = {"lora_name": "fx", "lora_path": str(tmp_path / "no" / "such" / "fx"),
           "load_inplace": True}  # fmt: skip

    async with openai.AsyncOpenAI(base_url=f"{admin_frontend.url}/v1", api_key="-",
                                  max_retries=0) as client:  # fmt: skip

        async def chat() -> str:
            answer = await client.chat.completions.create(
                model="fx", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            return answer.model

        loop = ChatLoop(chat)
        await loop.more(3)
        failed = await http.post("/v1/load_lora_adapter", json=bad, headers=AUTH, timeout=WAIT_S)
        await loop.more(6)
        errors = await loop.stop()

    assert failed.status_code == 404, failed.text
    assert errors == []
    assert set(loop.answers) == {"fx"}
    for worker in workers:  # the engines hold the old weights, and the cards say so
        assert await asyncio.to_thread(worker_digests, worker) == {"fx": adapter_digest()}
    served = admin_frontend.registry.get("fx")
    assert served is not None and len(served.instances) == 2
    for instance in served.instances:
        card = admin_frontend.registry.card_on("fx", instance.instance_id)
        assert card is not None and card.digest == adapter_digest()
        assert card.source == f"file://{good['lora_path']}"
    status = (await http.get("/v1/adapters/fx")).json()  # the desired state is put back
    assert status["state"] == "placed" and len(status["instances"]) == 2
    assert status["digest"] == adapter_digest()
    error = failed.json()["error"]
    assert error["type"] == "NotFoundError"
    assert "'fx'" in error["message"] and "swap fetch step failed" in error["message"]
    assert f"{adapter_digest()} keeps serving" in error["message"]


async def test_a_fleet_wide_load_inplace_to_new_weights_changes_the_answers_of_every_holder(
    demo: DemoModelPaths, admin_frontend: RunningFrontend, tmp_path: Path, etcd_url: str,
    nats_url: str, namespace: str, etcd,
) -> None:  # fmt: skip
    """Two hf workers hold ``fx`` from the pirate folder; vLLM's ``load_inplace`` through the
    frontend swaps it to the robot folder. A client chatting through the frontend meanwhile
    gets the pirate's or the robot's answer, never an error or the base model's; afterwards
    each worker, asked directly, answers as the robot."""
    argv = ("--engine", "hf", "--served-model-name", DEMO_MODEL_NAME, "--enable-lora")
    env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "loras")}
    workers = [
        start_worker(tmp_path, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace,
                     model=str(demo.base), args=argv, env=env, wait=False)
        for _ in range(2)
    ]  # fmt: skip
    try:
        for worker in workers:
            await asyncio.to_thread(worker.wait_ready)
        await wait_for_models(admin_frontend, {DEMO_MODEL_NAME}, timeout_s=WAIT_S)
        http = admin_frontend.http
        pirate = {"lora_name": "fx", "lora_path": str(demo.adapters["pirate"])}
        loaded = await http.post("/v1/load_lora_adapter", json=pirate, headers=AUTH,
                                 timeout=WAIT_S)  # fmt: skip
        assert loaded.status_code == 200, loaded.text
        await holders(admin_frontend, "fx", 2)
        robot = {"lora_name": "fx", "lora_path": str(demo.adapters["robot"]),
                 "load_inplace": True}  # fmt: skip

        async with openai.AsyncOpenAI(base_url=f"{admin_frontend.url}/v1", api_key="-",
                                      max_retries=0, timeout=WAIT_S) as client:  # fmt: skip

            async def chat() -> str:
                answer = await client.chat.completions.create(
                    model="fx", messages=[{"role": "user", "content": EXPECTED_PROMPT}],
                    max_tokens=64, temperature=0.0,
                )  # fmt: skip
                return answer.choices[0].message.content or ""

            loop = ChatLoop(chat)
            await loop.more(2)
            swapped = await http.post("/v1/load_lora_adapter", json=robot, headers=AUTH,
                                      timeout=WAIT_S)  # fmt: skip
            await holders(admin_frontend, "fx", 2, source=robot["lora_path"])
            await loop.more(2)  # sent once both workers serve the robot's weights
            errors = await loop.stop()
        direct = await _answers_of_each_worker(nats_url, etcd, namespace, "fx")
    finally:
        for worker in workers:
            worker.terminate()

    assert swapped.status_code == 200, swapped.text
    assert errors == []
    assert loop.answers[0] == EXPECTED["pirate"]
    assert set(loop.answers) <= {EXPECTED["pirate"], EXPECTED["robot"]}, loop.answers
    assert loop.answers[-1] == EXPECTED["robot"]
    assert direct == [EXPECTED["robot"]] * 2


async def _answers_of_each_worker(nats_url: str, etcd, namespace: str, model: str) -> list[str]:
    """Each live worker's greedy answer to the demo prompt, asked over its own subject."""
    listing = await etcd.get_prefix(f"v1/instances/{namespace}/".encode())
    subjects = sorted({decode_instance(kv.value).subject for kv in listing})
    request = GenerateRequest(
        request_id="direct", model=model,
        messages=[ChatMessage(role="user", content=EXPECTED_PROMPT)],
        sampling=SamplingParams(max_tokens=64, temperature=0.0),
    )  # fmt: skip
    nc = await nats.connect(nats_url)
    try:
        answers = [await stream(nc, subject, request, timeout_s=WAIT_S) for subject in subjects]
    finally:
        await nc.close()
    texts = []
    for chunks in answers:
        assert isinstance(chunks[-1], FinalChunk), chunks[-1]
        texts.append("".join(c.text for c in chunks if isinstance(c, TokenChunk)))
    return texts
