"""End to end on the demo model: an hf worker with LoRA, a frontend, the openai client.

The adapter lifecycle as a user meets it: load through the worker's routes, see
the adapter in ``/v1/models`` and its card through ``etcdctl``, chat with it,
unload it, and see the base model answer the same throughout.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from lorafleet.launch.demo_model import EXPECTED, EXPECTED_PROMPT, DemoModelPaths
from tests.etcdctl_output import json_values
from tests.processes import ServiceProcess, start_frontend, start_worker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(
    demo: DemoModelPaths, etcd_url: str, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServiceProcess, ServiceProcess, str]]:
    """One hf worker serving the demo model as ``demo`` and one frontend, in their own namespace."""
    log_dir = tmp_path_factory.mktemp("demo-cluster")
    namespace = "e2edemo"
    args = ("--engine", "hf", "--served-model-name", "demo", "--enable-lora")
    worker = start_worker(
        log_dir, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace,
        model=str(demo.base), args=args,
        env={"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(log_dir / "cache")},
    )  # fmt: skip
    frontend = start_frontend(log_dir, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace)
    yield worker, frontend, namespace
    frontend.terminate()
    worker.terminate()


def _chat(client: openai.OpenAI, model: str) -> str:
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": EXPECTED_PROMPT}], temperature=0
    )
    return answer.choices[0].message.content or ""


def _etcdctl_cards(etcd_url: str, namespace: str) -> list[dict]:
    etcdctl = Path(sys.executable).parent / "etcdctl"
    output = subprocess.run(
        [str(etcdctl), "--endpoints", etcd_url, "get", "--prefix", f"v1/mdc/{namespace}/",
         "--print-value-only"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return json_values(output)


def _model_ids(frontend: ServiceProcess) -> dict[str, str | None]:
    data = httpx.get(f"{frontend.url}/v1/models").json()["data"]
    return {model["id"]: model["parent"] for model in data}


async def _wait_models(frontend: ServiceProcess, expected: dict[str, str | None]) -> None:
    async with asyncio.timeout(10):
        while await asyncio.to_thread(_model_ids, frontend) != expected:
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("routes", ["engine", "compat"])
async def test_adapter_lifecycle_through_frontend_openai_and_etcdctl(
    cluster, demo, etcd_url, routes
):
    worker, frontend, namespace = cluster
    client = openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)
    assert await asyncio.to_thread(_chat, client, "demo") == EXPECTED["base"]
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as admin:
        body = {"lora_name": "pirate", "source": {"uri": f"file://{demo.adapters['pirate']}"}}
        path = "/engine/update/load_lora" if routes == "engine" else "/v1/loras"
        assert (await admin.post(path, json=body)).status_code == 200
        await _wait_models(frontend, {"demo": None, "pirate": "demo"})
        cards = await asyncio.to_thread(_etcdctl_cards, etcd_url, namespace)
        assert sorted(card["display_name"] for card in cards) == ["demo", "pirate"]
        (adapter_card,) = [card for card in cards if card["lora"]]
        assert adapter_card["lora"]["base_model"] == "demo"
        assert await asyncio.to_thread(_chat, client, "pirate") == EXPECTED["pirate"]
        assert await asyncio.to_thread(_chat, client, "demo") == EXPECTED["base"]
        if routes == "engine":
            response = await admin.post("/engine/update/unload_lora", json={"lora_name": "pirate"})
        else:
            response = await admin.delete("/v1/loras/pirate")
        assert response.status_code == 200
    await _wait_models(frontend, {"demo": None})
    assert [
        c["display_name"] for c in await asyncio.to_thread(_etcdctl_cards, etcd_url, namespace)
    ] == ["demo"]
    with pytest.raises(openai.NotFoundError, match="pirate"):
        await asyncio.to_thread(_chat, client, "pirate")
    assert await asyncio.to_thread(_chat, client, "demo") == EXPECTED["base"]


async def test_base_and_two_adapters_in_flight_together_each_answer_their_own(cluster, demo):
    worker, frontend, _ = cluster
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as admin:
        for name in ("pirate", "robot"):
            body = {"lora_name": name, "source": {"uri": f"file://{demo.adapters[name]}"}}
            assert (await admin.post("/engine/update/load_lora", json=body)).status_code == 200
    await _wait_models(frontend, {"demo": None, "pirate": "demo", "robot": "demo"})
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)
    models = ["demo", "pirate", "robot"] * 3
    answers = await asyncio.gather(
        *(
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": EXPECTED_PROMPT}], temperature=0
            )
            for model in models
        )
    )
    expected = {"demo": EXPECTED["base"], "pirate": EXPECTED["pirate"], "robot": EXPECTED["robot"]}
    assert [a.choices[0].message.content for a in answers] == [expected[m] for m in models]
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as admin:
        for name in ("pirate", "robot"):
            await admin.post("/engine/update/unload_lora", json={"lora_name": name})
