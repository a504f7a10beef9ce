"""vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` on the frontend, fleet-wide.

With vLLM's exact bodies: a load stores the adapter in the desired state for
every instance of its base model (``replicas: "all"``) and real mocker workers
load it; an unload deletes the declaration and the workers drop it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from lorafleet.discovery.keys import adapter_key
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from lorafleet.proto.adapters import AdapterSpec
from lorafleet.proto.naming import lora_slug
from tests.frontend.conftest import FAST_DISPATCH, RunningFrontend, run_frontend, wait_for_models
from tests.frontend.stand_in import StandInWorker
from tests.worker.adapters import make_adapter_dir

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONVERGE_TIMEOUT_S = 60.0


def _vllm_error(message: str, err_type: str, code: int) -> dict:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


@pytest.fixture
async def admin_frontend(etcd_url: str, nats_url: str, namespace: str):
    config = FrontendConfig(namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url, dispatch=FAST_DISPATCH,
                            admin_token=TOKEN)  # fmt: skip
    async with run_frontend(config) as running:
        yield running


async def _instances(frontend: RunningFrontend, name: str, count: int) -> None:
    """Wait until ``count`` live instances have adapter ``name``'s card."""
    async with asyncio.timeout(CONVERGE_TIMEOUT_S):
        while True:
            served = frontend.registry.get(name)
            if len(served.instances if served is not None else ()) == count:
                return
            await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_vllm_load_puts_the_adapter_on_every_instance_and_unload_removes_it(
    lora_workers, admin_frontend, tmp_path: Path, etcd, namespace
) -> None:
    await asyncio.to_thread(lora_workers, 2)
    await wait_for_models(admin_frontend, {"demo"}, timeout_s=30)
    path = str(make_adapter_dir(tmp_path / "adapters", "sql"))
    http = admin_frontend.http

    loaded = await http.post(
        "/v1/load_lora_adapter", json={"lora_name": "sql-lora", "lora_path": path}, headers=AUTH
    )

    assert loaded.status_code == 200, loaded.text
    assert loaded.text == "Success: LoRA adapter 'sql-lora' added successfully."
    stored = await etcd.get(adapter_key(namespace, lora_slug("sql-lora")).encode())
    spec = msgspec.json.decode(stored.value, type=AdapterSpec)
    assert (spec.base_model, spec.replicas, spec.source.uri) == ("demo", "all", f"file://{path}")
    await _instances(admin_frontend, "sql-lora", 2)
    unloaded = await http.post(
        "/v1/unload_lora_adapter", json={"lora_name": "sql-lora"}, headers=AUTH
    )
    assert unloaded.status_code == 200, unloaded.text
    assert unloaded.text == "Success: LoRA adapter 'sql-lora' removed successfully."
    await _instances(admin_frontend, "sql-lora", 0)


@pytest.fixture
async def demo(workers, nats_url, etcd, namespace, admin_frontend) -> StandInWorker:
    worker = await StandInWorker(nats_url, etcd, namespace, "demo").start()
    workers.append(worker)
    await wait_for_models(admin_frontend, {"demo"})
    return worker


async def test_vllm_errors_on_the_frontend_are_vllm_shaped(admin_frontend, demo) -> None:
    http = admin_frontend.http
    body = {"lora_name": "sql-lora", "lora_path": "s3://bucket/sql"}
    assert (await http.post("/v1/load_lora_adapter", json=body, headers=AUTH)).status_code == 200
    again = await http.post("/v1/load_lora_adapter", json=body, headers=AUTH)
    assert again.status_code == 400
    assert again.json() == _vllm_error(
        "The lora adapter 'sql-lora' has already been loaded.", "InvalidUserInput", 400
    )
    missing = await http.post("/v1/load_lora_adapter", json={"lora_name": "x"}, headers=AUTH)
    assert missing.json() == _vllm_error(
        "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", 400
    )
    gone = await http.post("/v1/unload_lora_adapter", json={"lora_name": "nope"}, headers=AUTH)
    assert gone.status_code == 404
    assert gone.json() == _vllm_error(
        "The lora adapter 'nope' cannot be found.", "NotFoundError", 404
    )
    relative = {"lora_name": "rel", "lora_path": "adapters/../x/y"}
    bad = await http.post("/v1/load_lora_adapter", json=relative, headers=AUTH)
    assert bad.status_code == 400 and "lora_path" in bad.json()["error"]["message"]


async def test_vllm_routes_on_the_frontend_need_the_admin_token(admin_frontend, demo) -> None:
    http = admin_frontend.http
    body = {"lora_name": "sql-lora", "lora_path": "s3://bucket/sql"}
    assert (await http.post("/v1/load_lora_adapter", json=body)).status_code == 401
    assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "x"})).status_code == 401


async def test_base_model_must_be_named_when_several_are_served(
    admin_frontend, demo, workers, nats_url, etcd, namespace
) -> None:
    other = await StandInWorker(nats_url, etcd, namespace, "other").start()
    workers.append(other)
    await wait_for_models(admin_frontend, {"demo", "other"})
    http = admin_frontend.http
    body = {"lora_name": "sql-lora", "lora_path": "s3://bucket/sql"}
    ambiguous = await http.post("/v1/load_lora_adapter", json=body, headers=AUTH)
    assert ambiguous.status_code == 400
    assert "base_model_name" in ambiguous.json()["error"]["message"]
    named = await http.post(
        "/v1/load_lora_adapter", json={**body, "base_model_name": "other"}, headers=AUTH
    )
    assert named.status_code == 200, named.text
