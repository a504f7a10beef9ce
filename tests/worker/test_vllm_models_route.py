"""vLLM's ``GET /v1/models`` on a real mocker worker's status port: base model and adapters."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.worker.adapters import make_adapter_dir


async def test_models_lists_the_base_and_each_adapter_held_in_vllm_shape(
    worker_factory, tmp_path: Path
) -> None:
    adapter = make_adapter_dir(tmp_path / "adapters", "sql")
    env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
    worker = worker_factory("--enable-lora", "--context-length", "1024", env=env)
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:
        before = (await client.get("/v1/models")).json()
        assert before["object"] == "list"
        assert [(m["id"], m["object"], m["max_model_len"]) for m in before["data"]] == [
            ("demo", "model", 1024)
        ]
        body = {"lora_name": "sql-lora", "lora_path": str(adapter)}
        loaded = await client.post("/v1/load_lora_adapter", json=body)
        assert loaded.status_code == 200, loaded.text
        after = await client.get("/v1/models")
    models = {m["id"]: m for m in after.json()["data"]}
    assert models.keys() == {"demo", "sql-lora"}
    assert (models["sql-lora"]["parent"], models["sql-lora"]["root"]) == ("demo", "sql-lora")
    assert str(tmp_path) not in after.text  # no worker path leaves
