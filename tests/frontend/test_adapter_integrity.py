"""An expected ``sha256`` in the desired state, over a real frontend and a real mocker worker:
placement carries it to the worker, a mismatch shows ``failed`` with both digests in
``/v1/adapters``, and vLLM's load route on the frontend answers 409 and puts the desired state
back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from lorafleet.launch.cli import main as lorafleet
from tests.frontend.conftest import wait_for_models
from tests.worker.adapters import adapter_digest, make_adapter_dir

pytestmark = pytest.mark.slow

WAIT_S = 60.0


async def _status_when(
    http: httpx.AsyncClient, name: str, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """``GET /v1/adapters/{name}`` once ``done`` holds for it (polled; placement is async)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            status: dict[str, Any] = (await http.get(f"/v1/adapters/{name}")).json()
            if done(status):
                return status
            await asyncio.sleep(0.1)


async def _apply(http: httpx.AsyncClient, uri: str, sha256: str) -> httpx.Response:
    source = {"uri": uri, "sha256": sha256}
    body = {"name": "pirate", "base_model": "demo", "source": source, "replicas": 1}
    return await http.post("/v1/adapters", json=body)


async def test_the_desired_state_carries_sha256_to_placement_and_a_mismatch_shows_failed(
    lora_workers, frontend, tmp_path: Path
) -> None:
    await asyncio.to_thread(lora_workers, 1)
    await wait_for_models(frontend, {"demo"})
    uri = f"file://{make_adapter_dir(tmp_path / 'adapters', 'pirate')}"
    right, wrong = adapter_digest(), "sha256:" + "f" * 64

    assert (await _apply(frontend.http, uri, wrong)).status_code == 201
    failed = await _status_when(frontend.http, "pirate", lambda s: s["state"] == "failed")

    assert failed["source"]["sha256"] == wrong
    assert failed["error"]["code"] == "conflict"
    assert right in failed["error"]["message"] and wrong in failed["error"]["message"]
    argv = ["lora", "apply", "pirate", uri, "--base-model", "demo", "--frontend", frontend.url,
            "--sha256", right.removeprefix("sha256:"), "--wait-s", "0"]  # fmt: skip
    await asyncio.to_thread(lorafleet, argv)  # exit 1 while the last failure still shows
    placed = await _status_when(frontend.http, "pirate", lambda s: s["state"] == "placed")
    assert placed["digest"] == right
    bad = ["lora", "apply", "pirate", uri, "--base-model", "demo", "--sha256", "abc"]
    with pytest.raises(SystemExit):  # argparse: usage and exit 2, nothing sent
        lorafleet(bad)


async def test_a_malformed_sha256_in_the_desired_state_is_a_400(frontend) -> None:
    response = await _apply(frontend.http, "file:///adapters/pirate", "sha256:not-hex")
    assert response.status_code == 400, response.text
    assert "sha256" in response.text
    assert (await frontend.http.get("/v1/adapters/pirate")).status_code == 404


async def test_vllm_load_on_the_frontend_with_a_wrong_sha256_is_409_and_declares_nothing(
    lora_workers, frontend, tmp_path: Path
) -> None:
    await asyncio.to_thread(lora_workers, 1)
    await wait_for_models(frontend, {"demo"})
    path = make_adapter_dir(tmp_path / "adapters", "pirate")
    body = {"lora_name": "pirate", "lora_path": str(path), "sha256": "0" * 64}

    refused = await frontend.http.post("/v1/load_lora_adapter", json=body, timeout=WAIT_S)

    assert refused.status_code == 409, refused.text
    assert adapter_digest() in refused.json()["error"]["message"]
    assert (await frontend.http.get("/v1/adapters/pirate")).status_code == 404
    body["sha256"] = adapter_digest()
    loaded = await frontend.http.post("/v1/load_lora_adapter", json=body, timeout=WAIT_S)
    assert loaded.status_code == 200, loaded.text


async def test_an_adapter_for_another_base_model_shows_its_warning_in_v1_adapters(
    lora_workers, frontend, tmp_path: Path
) -> None:
    await asyncio.to_thread(lora_workers, 1)  # DYN_LORA_BASE_MODEL_CHECK: warn, the default
    await wait_for_models(frontend, {"demo"})
    path = make_adapter_dir(tmp_path / "adapters", "pirate", base_model="meta-llama/Llama-3-8B")
    body = {"name": "pirate", "base_model": "demo", "source": {"uri": f"file://{path}"},
            "replicas": 1}  # fmt: skip
    assert (await frontend.http.post("/v1/adapters", json=body)).status_code == 201

    placed = await _status_when(frontend.http, "pirate", lambda s: s["state"] == "placed")

    (warning,) = placed["warnings"]
    assert "trained for base model 'meta-llama/Llama-3-8B'" in warning and "'demo'" in warning


async def test_a_swap_refused_for_its_sha256_shows_failed_while_the_old_version_serves(
    lora_workers, frontend, tmp_path: Path
) -> None:
    await asyncio.to_thread(lora_workers, 1)
    await wait_for_models(frontend, {"demo"})
    uri = f"file://{make_adapter_dir(tmp_path / 'adapters', 'pirate')}"
    right, wrong = adapter_digest(), "sha256:" + "f" * 64
    assert (await _apply(frontend.http, uri, right)).status_code == 201
    placed = await _status_when(frontend.http, "pirate", lambda s: s["state"] == "placed")

    assert (await _apply(frontend.http, uri, wrong)).status_code == 201  # a swap, refused
    failed = await _status_when(frontend.http, "pirate", lambda s: s["state"] == "failed")

    assert failed["error"]["code"] == "conflict" and wrong in failed["error"]["message"]
    assert "keeps serving" in failed["error"]["message"]
    assert (failed["digest"], failed["instances"]) == (right, placed["instances"])
    chat = {"model": "pirate", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    answer = await frontend.http.post("/v1/chat/completions", json=chat, timeout=WAIT_S)
    assert answer.status_code == 200, answer.text
    assert (await _apply(frontend.http, uri, right)).status_code == 201  # back as it serves
    await _status_when(frontend.http, "pirate", lambda s: s["state"] == "placed")
