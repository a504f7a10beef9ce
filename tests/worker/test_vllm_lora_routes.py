"""vLLM's runtime LoRA routes on a real mocker worker, with vLLM's exact bodies and answers.

The expected answers are those of vLLM's OpenAI server
(``vllm/entrypoints/openai/serving_models.py``): plain-text 200s and
``{"error": {"message", "type", "param", "code"}}`` errors.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from lorafleet.proto.discovery import decode_card
from tests.processes import ServiceProcess
from tests.worker.adapters import make_adapter_dir

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def adapter_dirs(tmp_path: Path) -> dict[str, str]:
    """Plain local paths, as vLLM users pass them in ``lora_path``."""
    return {name: str(make_adapter_dir(tmp_path / "adapters", name)) for name in ("sql", "chef")}


@pytest.fixture
def vllm_worker(worker_factory, tmp_path: Path) -> ServiceProcess:
    env = {
        "DYN_LORA_ENABLED": "true",
        "DYN_LORA_PATH": str(tmp_path / "cache"),
        "DYN_SYSTEM_AUTH_TOKEN": TOKEN,
    }
    return worker_factory("--enable-lora", "--max-loras", "4", env=env)


def _vllm_error(message: str, err_type: str, code: int) -> dict:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


async def _adapter_cards(etcd, namespace: str) -> dict[str, str]:
    listing = await etcd.get_prefix(f"v1/mdc/{namespace}/".encode())
    cards = [decode_card(kv.value) for kv in listing]
    return {card.lora.name: card.lora.uri for card in cards if card.lora}


async def test_vllm_load_and_unload_bodies_get_vllm_answers(
    vllm_worker, adapter_dirs, etcd, namespace
) -> None:
    body = {"lora_name": "sql-lora", "lora_path": adapter_dirs["sql"]}
    async with httpx.AsyncClient(base_url=vllm_worker.url, headers=AUTH) as client:
        loaded = await client.post("/v1/load_lora_adapter", json=body)
        assert loaded.status_code == 200, loaded.text
        assert loaded.text == "Success: LoRA adapter 'sql-lora' added successfully."
        assert await _adapter_cards(etcd, namespace) == {
            "sql-lora": f"file://{adapter_dirs['sql']}"
        }
        again = await client.post("/v1/load_lora_adapter", json=body)
        assert again.status_code == 400
        assert again.json() == _vllm_error(
            "The lora adapter 'sql-lora' has already been loaded.", "InvalidUserInput", 400
        )
        unloaded = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql-lora"})
        assert unloaded.status_code == 200, unloaded.text
        assert unloaded.text == "Success: LoRA adapter 'sql-lora' removed successfully."
        assert await _adapter_cards(etcd, namespace) == {}
        missing = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql-lora"})
        assert missing.status_code == 404
        assert missing.json() == _vllm_error(
            "The lora adapter 'sql-lora' cannot be found.", "NotFoundError", 404
        )


@pytest.mark.parametrize(
    ("route", "body", "message"),
    [
        ("load", {"lora_name": "x"}, "Both 'lora_name' and 'lora_path' must be provided."),
        ("load", {"lora_path": "/x"}, "Both 'lora_name' and 'lora_path' must be provided."),
        ("unload", {}, "either 'lora_name' and 'lora_int_id' needs to be provided."),
    ],
)
async def test_missing_fields_are_vllm_invalid_user_input(
    vllm_worker, route: str, body: dict, message: str
) -> None:
    async with httpx.AsyncClient(base_url=vllm_worker.url, headers=AUTH) as client:
        response = await client.post(f"/v1/{route}_lora_adapter", json=body)
    assert response.status_code == 400
    assert response.json() == _vllm_error(message, "InvalidUserInput", 400)


async def test_load_of_a_missing_path_is_vllm_not_found(vllm_worker, tmp_path: Path) -> None:
    body = {"lora_name": "ghost", "lora_path": str(tmp_path / "nowhere")}
    async with httpx.AsyncClient(base_url=vllm_worker.url, headers=AUTH) as client:
        response = await client.post("/v1/load_lora_adapter", json=body)
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("NotFoundError", 404)
    assert "nowhere" in error["message"]


async def test_load_inplace_replaces_a_loaded_adapter(
    vllm_worker, adapter_dirs, etcd, namespace, tmp_path
) -> None:
    other = make_adapter_dir(tmp_path / "v2", "sql", weights=b"\x01" * 16)  # new weights
    async with httpx.AsyncClient(base_url=vllm_worker.url, headers=AUTH) as client:
        first = {"lora_name": "sql-lora", "lora_path": adapter_dirs["sql"]}
        assert (await client.post("/v1/load_lora_adapter", json=first)).status_code == 200
        second = {"lora_name": "sql-lora", "lora_path": str(other), "load_inplace": True}
        replaced = await client.post("/v1/load_lora_adapter", json=second)
        assert replaced.status_code == 200, replaced.text
    assert await _adapter_cards(etcd, namespace) == {"sql-lora": f"file://{other}"}


async def test_vllm_routes_need_the_system_token(vllm_worker, adapter_dirs) -> None:
    body = {"lora_name": "sql-lora", "lora_path": adapter_dirs["sql"]}
    async with httpx.AsyncClient(base_url=vllm_worker.url) as client:
        refused = await client.post("/v1/load_lora_adapter", json=body)
        assert refused.status_code == 401
        assert "DYN_SYSTEM_AUTH_TOKEN" in refused.json()["error"]["message"]
        unload = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql-lora"})
        assert unload.status_code == 401
        wrong = await client.post(
            "/v1/load_lora_adapter", json=body, headers={"Authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401


async def test_vllm_routes_say_what_is_missing_when_lora_is_off(worker_factory, tmp_path) -> None:
    worker = worker_factory(env={"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path)})
    body = {"lora_name": "sql-lora", "lora_path": str(tmp_path)}
    async with httpx.AsyncClient(base_url=worker.url) as client:
        response = await client.post("/v1/load_lora_adapter", json=body)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "NotFoundError"
    assert "without --enable-lora" in error["message"]
