"""A real mocker worker loading from S3 (a moto server) with an expected ``sha256``: files with
another digest are refused, and their cached copy is deleted so a retry downloads again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from lorafleet.worker.lora.digest import content_digest


def _cached(cache: Path) -> list[str]:
    return (
        sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
        if cache.exists()
        else []
    )


async def test_a_wrong_sha256_deletes_the_downloaded_copy_and_a_retry_downloads_again(
    worker_factory, tmp_path: Path, aws_env: Any, upload: Callable[..., str],
    make_adapter: Callable[..., Path],
) -> None:  # fmt: skip
    cache = tmp_path / "cache"
    env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(cache)}
    worker = worker_factory("--enable-lora", env=env)
    uri = upload("adapters/pirate")
    right = content_digest(make_adapter(tmp_path / "local"))
    wrong = "sha256:" + "0" * 64
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as client:
        body = {"lora_name": "pirate", "source": {"uri": uri, "sha256": wrong}}
        refused = await client.post("/engine/update/load_lora", json=body)
        assert refused.status_code == 409, refused.text
        message = refused.json()["message"]
        assert right in message and wrong in message and "cached copy was deleted" in message
        assert _cached(cache) == []

        aws_env.reset_requests()
        body["source"] = {"uri": uri, "sha256": right}
        loaded = await client.post("/engine/update/load_lora", json=body)
        assert loaded.status_code == 200, loaded.text
    assert any(request.startswith("GET") for request in aws_env.requests())
    assert len(_cached(cache)) == 1
