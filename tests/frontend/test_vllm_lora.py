"""vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` on the frontend, fleet-wide.

With vLLM's exact bodies: a load stores the adapter in the desired state for
every instance of its base model (``replicas: "all"``), real mocker workers
load it, and the answer comes once one has (or with the error that stopped
it); an unload deletes the declaration and the workers drop it, or unloads an
adapter loaded straight onto workers from each of them.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import msgspec
import pytest

from lorafleet.discovery.keys import adapter_key, adapters_prefix
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from lorafleet.proto.adapters import AdapterSpec
from lorafleet.proto.discovery import ModelDeploymentCard, decode_card
from lorafleet.proto.naming import lora_slug
from tests.frontend.conftest import FAST_DISPATCH, RunningFrontend, run_frontend, wait_for_models
from tests.frontend.stand_in import StandInWorker
from tests.frontend.test_on_demand import _instance_id, _loaded
from tests.worker.adapters import lying_adapters, make_adapter_dir

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONVERGE_TIMEOUT_S = 60.0


def _vllm_error(message: str, err_type: str, code: int) -> dict:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


QUICK_WAIT_S = 1.0
"""How long the frontend of stand-in tests waits for a load (stand-ins never load: 202)."""


@pytest.fixture
async def admin_frontend(request: pytest.FixtureRequest, etcd_url: str, nats_url: str,
                         namespace: str):  # fmt: skip
    """A frontend with an admin token; tests marked ``slow`` (real workers) wait for loads as
    long as the default on-demand timeout, the others ``QUICK_WAIT_S``."""
    slow = request.node.get_closest_marker("slow") is not None
    config = FrontendConfig(namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url, dispatch=FAST_DISPATCH, admin_token=TOKEN,
                            **({} if slow else {"on_demand_timeout_s": QUICK_WAIT_S}))  # fmt: skip
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
    assert admin_frontend.registry.get("sql-lora") is not None  # loaded when answered
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
    """A stand-in worker of ``demo``: it runs no placement, so nothing it is declared loads."""
    worker = await StandInWorker(nats_url, etcd, namespace, "demo").start()
    workers.append(worker)
    await wait_for_models(admin_frontend, {"demo"})
    return worker


async def test_a_load_that_cannot_finish_in_the_wait_answers_202_not_a_200(
    admin_frontend, demo
) -> None:
    body = {"lora_name": "sql-lora", "lora_path": "s3://bucket/sql"}
    accepted = await admin_frontend.http.post("/v1/load_lora_adapter", json=body, headers=AUTH)
    assert accepted.status_code == 202, accepted.text
    assert accepted.text.startswith("Accepted: LoRA adapter 'sql-lora' is declared and still")
    status = (await admin_frontend.http.get("/v1/adapters/sql-lora")).json()
    assert (status["state"], status["replicas"]) == ("pending", "all")


async def test_vllm_errors_on_the_frontend_are_vllm_shaped(admin_frontend, demo) -> None:
    http = admin_frontend.http
    body = {"lora_name": "sql-lora", "lora_path": "s3://bucket/sql"}
    assert (await http.post("/v1/load_lora_adapter", json=body, headers=AUTH)).status_code == 202
    retry = await http.post("/v1/load_lora_adapter", json=body, headers=AUTH)
    assert retry.status_code == 202  # declared, loaded nowhere yet: a retry waits again
    other = {"lora_name": "sql-lora", "lora_path": "s3://bucket/other"}
    again = await http.post("/v1/load_lora_adapter", json=other, headers=AUTH)
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


async def test_a_vllm_load_named_like_an_alias_is_the_same_409_as_post_adapters(
    admin_frontend, demo
) -> None:
    http = admin_frontend.http
    body = {"name": "bot-v1", "base_model": "demo", "source": {"uri": "s3://bucket/v1"}}
    assert (await http.post("/v1/adapters", json=body, headers=AUTH)).status_code == 201
    alias = {"name": "bot", "targets": [{"model": "bot-v1", "weight": 100}]}
    assert (await http.post("/v1/aliases", json=alias, headers=AUTH)).status_code == 201
    spec = {"name": "bot", "base_model": "demo", "source": {"uri": "s3://bucket/bot"}}
    adapters = await http.post("/v1/adapters", json=spec, headers=AUTH)

    load = {"lora_name": "bot", "lora_path": "s3://bucket/bot"}
    refused = await http.post("/v1/load_lora_adapter", json=load, headers=AUTH)

    assert adapters.status_code == refused.status_code == 409, refused.text
    message = adapters.json()["error"]["message"]
    assert refused.json() == _vllm_error(message, "BadRequestError", 409)
    assert "'bot' is an alias" in message
    assert (await http.get("/v1/adapters/bot")).status_code == 404  # nothing declared
    ids = [model["id"] for model in (await http.get("/v1/models")).json()["data"]]
    assert ids.count("bot") == 1


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
    assert named.status_code == 202, named.text  # declared: stand-ins load nothing themselves


def _load_attempts(worker) -> float:
    """Every load the worker's lifecycle ran, whatever its outcome."""
    text = httpx.get(f"{worker.url}/metrics").text
    pattern = r'lorafleet_worker_adapter_operations_total\{operation="load",outcome="[^"]*"\} (\S+)'
    return sum(float(value) for value in re.findall(pattern, text))


@pytest.mark.slow
async def test_statically_wrong_input_answers_4xx_and_changes_nothing(
    lora_workers, admin_frontend, tmp_path: Path, etcd, namespace
) -> None:
    (worker,) = await asyncio.to_thread(lora_workers, 1, "--max-lora-rank", "8")
    await wait_for_models(admin_frontend, {"demo"}, timeout_s=30)
    wide = make_adapter_dir(tmp_path / "adapters", "wide")
    config = json.loads((wide / "adapter_config.json").read_text())
    (wide / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    a_file = tmp_path / "weights.bin"
    a_file.write_bytes(b"\0" * 1024)
    cases = {
        "http://example.com/adapter": "web URL",
        "/etc": "adapter_config.json is missing",
        str(a_file): "not a directory",
        str(wide): "has rank 16",
        "adapters/../x/y": "lora_path",
    }
    lying = lying_adapters(tmp_path / "lying")  # weights that are no safetensors by content
    cases |= {str(path): f"of adapter 'bad' is no LoRA adapter: {p}" for path, p in lying.items()}
    for path, problem in cases.items():
        body = {"lora_name": "bad", "lora_path": path}
        answer = await admin_frontend.http.post("/v1/load_lora_adapter", json=body, headers=AUTH)
        assert answer.status_code == 400, (path, answer.text)
        assert problem in answer.json()["error"]["message"], (path, answer.text)
    assert list(await etcd.get_prefix(adapters_prefix(namespace).encode())) == []
    assert _load_attempts(worker) == 0  # no worker was asked


@pytest.mark.slow
async def test_a_path_no_worker_has_answers_the_workers_error_and_undeclares_it(
    lora_workers, admin_frontend, tmp_path: Path, etcd, namespace
) -> None:
    await asyncio.to_thread(lora_workers, 2)
    await wait_for_models(admin_frontend, {"demo"}, timeout_s=30)
    body = {"lora_name": "ghost", "lora_path": str(tmp_path / "no" / "such" / "adapter")}

    answer = await admin_frontend.http.post(
        "/v1/load_lora_adapter", json=body, headers=AUTH, timeout=CONVERGE_TIMEOUT_S
    )

    assert answer.status_code == 404, answer.text
    error = answer.json()["error"]
    assert error["type"] == "NotFoundError"
    assert "ghost" in error["message"] and str(tmp_path) not in error["message"]
    assert list(await etcd.get_prefix(adapters_prefix(namespace).encode())) == []
    listed = (await admin_frontend.http.get("/v1/models")).json()["data"]
    assert [entry["id"] for entry in listed] == ["demo"]


@pytest.mark.slow
async def test_an_adapter_loaded_straight_onto_workers_is_seen_and_vllm_unload_removes_it(
    lora_workers, admin_frontend, tmp_path: Path, etcd, namespace
) -> None:
    workers = await asyncio.to_thread(lora_workers, 2)
    await wait_for_models(admin_frontend, {"demo"}, timeout_s=30)
    uri = f"file://{make_adapter_dir(tmp_path / 'adapters', 'robot')}"
    for worker in workers:  # as `lorafleet lora load` does: no desired state
        body = {"lora_name": "robot", "source": {"uri": uri}}
        loaded = await asyncio.to_thread(
            httpx.post, f"{worker.url}/engine/update/load_lora", json=body, timeout=30
        )
        assert loaded.status_code == 200, loaded.text
    await _instances(admin_frontend, "robot", 2)
    http = admin_frontend.http
    card = await _card(etcd, namespace, "robot")

    status = (await http.get("/v1/adapters/robot")).json()
    listed = (await http.get("/v1/adapters")).json()["data"]
    models = {entry["id"]: entry for entry in (await http.get("/v1/models")).json()["data"]}

    assert status["state"] == "unmanaged" and listed == [status]
    assert status["base_model"] == "demo" and status["source"]["uri"] == "file:///***/robot"
    assert sorted(status["instances"]) == sorted(f"{_instance_id(w):x}" for w in workers)
    assert status["digest"] == card.lora.digest
    assert (models["robot"]["digest"] or "") == card.lora.digest
    again = {"lora_name": "robot", "lora_path": uri}
    refused = await http.post("/v1/load_lora_adapter", json=again, headers=AUTH)
    assert refused.status_code == 400 and "already been loaded" in refused.text

    unloaded = await http.post("/v1/unload_lora_adapter", json={"lora_name": "robot"}, headers=AUTH)

    assert unloaded.status_code == 200, unloaded.text
    assert unloaded.text == "Success: LoRA adapter 'robot' removed successfully."
    assert admin_frontend.registry.get("robot") is None
    assert all("robot" not in _loaded(worker) for worker in workers)
    assert (await http.get("/v1/adapters")).json()["data"] == []
    gone = await http.post("/v1/unload_lora_adapter", json={"lora_name": "robot"}, headers=AUTH)
    assert gone.status_code == 404


async def _card(etcd, namespace: str, name: str) -> ModelDeploymentCard:
    for kv in await etcd.get_prefix(f"v1/mdc/{namespace}/".encode()):
        card = decode_card(kv.value)
        if card.lora is not None and card.lora.name == name:
            return card
    raise AssertionError(f"no card of {name} in etcd")


@pytest.mark.slow
async def test_a_fleet_wide_reload_declares_the_new_source_and_never_claims_the_old_card(
    lora_workers, tmp_path: Path, etcd, etcd_url: str, nats_url: str, namespace: str
) -> None:
    config = FrontendConfig(namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url, dispatch=FAST_DISPATCH, admin_token=TOKEN,
                            on_demand_timeout_s=5)  # fmt: skip
    async with run_frontend(config) as frontend:
        await asyncio.to_thread(lora_workers, 1)
        await wait_for_models(frontend, {"demo"}, timeout_s=30)
        old = str(make_adapter_dir(tmp_path / "v1", "fx"))
        new = str(make_adapter_dir(tmp_path / "v2", "fx"))
        body = {"lora_name": "fx", "lora_path": old}
        first = await frontend.http.post("/v1/load_lora_adapter", json=body, headers=AUTH)
        assert first.status_code == 200, first.text
        same = {**body, "load_inplace": True}
        again = await frontend.http.post("/v1/load_lora_adapter", json=same, headers=AUTH)
        assert again.status_code == 200, again.text  # each holder: "nothing changed"

        reload = {"lora_name": "fx", "lora_path": new, "load_inplace": True}
        answer = await frontend.http.post(
            "/v1/load_lora_adapter", json=reload, headers=AUTH, timeout=30
        )

        stored = await etcd.get(adapter_key(namespace, lora_slug("fx")).encode())
        assert msgspec.json.decode(stored.value, type=AdapterSpec).source.uri == f"file://{new}"
        served = frontend.registry.get("fx")
        sources = {frontend.registry.card_on("fx", i.instance_id).source for i in served.instances}
        # 200 only once a worker swapped to the new source; until then 202, never a 200
        # over the old weights
        if answer.status_code == 200:
            assert f"file://{new}" in sources
        else:
            assert answer.status_code == 202, answer.text
            assert sources == {f"file://{old}"}


@pytest.mark.slow
async def test_a_load_onto_a_full_fleet_evicts_an_idle_adapter_and_answers_once_loaded(
    lora_workers, admin_frontend, tmp_path: Path
) -> None:
    await asyncio.to_thread(lora_workers, 1, "--max-loras", "1")
    await wait_for_models(admin_frontend, {"demo"}, timeout_s=30)
    for name in ("first", "second"):
        path = str(make_adapter_dir(tmp_path / "adapters", name))
        body = {"lora_name": name, "lora_path": path}
        answer = await admin_frontend.http.post(
            "/v1/load_lora_adapter", json=body, headers=AUTH, timeout=CONVERGE_TIMEOUT_S
        )
        assert answer.status_code == 200, answer.text
        assert admin_frontend.registry.get(name) is not None
