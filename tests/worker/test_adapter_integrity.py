"""What a real mocker worker checks before the engine sees a byte: the expected ``sha256`` of
the adapter's files, and the base model it was trained for (``DYN_LORA_BASE_MODEL_CHECK``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from lorafleet.launch.cli import main as lorafleet
from tests.processes import ServiceProcess
from tests.worker.adapters import adapter_digest, make_adapter_dir
from tests.worker.test_adapter_swaps import ClientLoop, _subject

V1, V2 = b"\x01" * 16, b"\x02" * 16


@pytest.fixture
def lora_worker(worker_factory, tmp_path: Path):
    def start(*args: str, env: dict[str, str] | None = None) -> ServiceProcess:
        full_env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
        return worker_factory("--enable-lora", *args, env={**full_env, **(env or {})})

    return start


async def _load(
    worker: ServiceProcess, name: str, path: Path, sha256: str | None = None, **more: object
) -> httpx.Response:
    source: dict[str, object] = {"uri": f"file://{path}"}
    if sha256 is not None:
        source["sha256"] = sha256
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as client:
        body = {"lora_name": name, "source": source, **more}
        return await client.post("/engine/update/load_lora", json=body)


async def _digests(worker: ServiceProcess) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as client:
        response = await client.post("/engine/update/list_loras", json={})
    return dict(response.json()["digests"])


async def test_a_wrong_sha256_is_refused_naming_both_digests_and_a_right_one_loads(
    lora_worker, tmp_path: Path
) -> None:
    worker = lora_worker()
    path = make_adapter_dir(tmp_path / "ad", "pirate", weights=V1)
    right, wrong = adapter_digest(weights=V1), adapter_digest(weights=V2)

    refused = await _load(worker, "pirate", path, sha256=wrong)

    assert refused.status_code == 409, refused.text
    assert right in refused.json()["message"] and wrong in refused.json()["message"]
    assert await _digests(worker) == {}
    bare_upper_hex = right.removeprefix("sha256:").upper()
    loaded = await _load(worker, "pirate", path, sha256=bare_upper_hex)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["digest"] == right
    assert await _digests(worker) == {"pirate": right}


@pytest.mark.parametrize("malformed", ["sha256:abc", "md5:" + "0" * 64, "z" * 64, ""])
async def test_a_malformed_sha256_is_a_400_and_changes_nothing(
    lora_worker, tmp_path: Path, malformed: str
) -> None:
    worker = lora_worker()
    path = make_adapter_dir(tmp_path / "ad", "pirate")
    response = await _load(worker, "pirate", path, sha256=malformed)
    assert response.status_code == 400, response.text
    assert "sha256" in response.text
    assert await _digests(worker) == {}


async def test_a_swap_with_a_wrong_sha256_keeps_the_old_version_serving_without_errors(
    lora_worker, tmp_path: Path, etcd, nc, namespace
) -> None:
    worker = lora_worker("--mocker-time-per-token-s", "0.005")
    v1 = make_adapter_dir(tmp_path / "v1", "swap", weights=V1)
    v2 = make_adapter_dir(tmp_path / "v2", "swap", weights=V2)
    assert (await _load(worker, "swap", v1)).status_code == 200
    loop = ClientLoop(nc, await _subject(etcd, namespace), "swap")
    await loop.more(3)
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as client:
        body = {"lora_name": "swap", "lora_path": str(v2), "load_inplace": True,
                "sha256": adapter_digest(weights=b"\x03" * 16)}  # fmt: skip
        refused = await client.post("/v1/load_lora_adapter", json=body)
        assert refused.status_code == 409, refused.text
        assert "keeps serving" in refused.json()["error"]["message"]
        await loop.more(3)
        assert await _digests(worker) == {"swap": adapter_digest(weights=V1)}
        body["sha256"] = adapter_digest(weights=V2)
        swapped = await client.post("/v1/load_lora_adapter", json=body)
        assert swapped.status_code == 200, swapped.text
    await loop.more(3)
    assert await loop.stop() == []
    assert await _digests(worker) == {"swap": adapter_digest(weights=V2)}


async def test_an_adapter_for_another_base_model_is_refused_under_strict(
    lora_worker, tmp_path: Path
) -> None:
    worker = lora_worker(env={"DYN_LORA_BASE_MODEL_CHECK": "strict"})
    other = make_adapter_dir(tmp_path / "ad", "llama-tuned", base_model="meta-llama/Llama-3-8B")

    refused = await _load(worker, "llama-tuned", other)

    assert refused.status_code == 400, refused.text
    message = refused.json()["message"]
    assert "llama-tuned" in message and "meta-llama/Llama-3-8B" in message and "'demo'" in message
    assert await _digests(worker) == {}
    same = make_adapter_dir(tmp_path / "ad", "demo-tuned", base_model="/models/DEMO")
    assert (await _load(worker, "demo-tuned", same)).status_code == 200  # last segment matches


async def test_an_alias_lets_an_adapter_load_under_strict(lora_worker, tmp_path: Path) -> None:
    env = {"DYN_LORA_BASE_MODEL_CHECK": "strict",
           "DYN_LORA_BASE_MODEL_ALIASES": "tiny-llama, meta-llama/Llama-3-8B"}  # fmt: skip
    worker = lora_worker(env=env)
    path = make_adapter_dir(tmp_path / "ad", "llama-tuned", base_model="meta-llama/Llama-3-8B")
    response = await _load(worker, "llama-tuned", path)
    assert response.status_code == 200, response.text
    assert response.json()["warnings"] == []


async def test_an_adapter_for_another_base_model_loads_with_a_warning_by_default(
    lora_worker, tmp_path: Path
) -> None:
    worker = lora_worker()
    other = make_adapter_dir(tmp_path / "ad", "llama-tuned", base_model="meta-llama/Llama-3-8B")

    response = await _load(worker, "llama-tuned", other)

    assert response.status_code == 200, response.text
    (warning,) = response.json()["warnings"]
    assert "meta-llama/Llama-3-8B" in warning and "'demo'" in warning
    assert "llama-tuned" in await _digests(worker)


async def test_the_base_model_check_can_be_turned_off(lora_worker, tmp_path: Path) -> None:
    worker = lora_worker(env={"DYN_LORA_BASE_MODEL_CHECK": "off"})
    other = make_adapter_dir(tmp_path / "ad", "llama-tuned", base_model="meta-llama/Llama-3-8B")
    response = await _load(worker, "llama-tuned", other)
    assert response.status_code == 200, response.text
    assert response.json()["warnings"] == []


async def test_lorafleet_lora_load_passes_sha256_and_a_mismatch_exits_1_naming_both(
    lora_worker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = lora_worker()
    path = make_adapter_dir(tmp_path / "ad", "pirate", weights=V1)
    right, wrong = adapter_digest(weights=V1), adapter_digest(weights=V2)
    argv = ["lora", "load", "pirate", f"file://{path}", "--worker", worker.url, "--json"]

    assert await asyncio.to_thread(lorafleet, [*argv, "--sha256", wrong]) == 1
    refused = capsys.readouterr().out
    assert right in refused and wrong in refused
    assert await _digests(worker) == {}
    assert await asyncio.to_thread(lorafleet, [*argv, "--sha256", right]) == 0
    assert await _digests(worker) == {"pirate": right}
    assert lorafleet(["lora", "unload", "pirate", "--sha256", right]) == 2  # not ignored


async def test_lorafleet_lora_load_replace_swaps_to_another_source(
    lora_worker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A load from another URI is refused with 409 "swap it with replace"; ``--replace`` is
    how the CLI says so."""
    worker = lora_worker()
    old = make_adapter_dir(tmp_path / "v1", "pirate", weights=V1)
    new = make_adapter_dir(tmp_path / "v2", "pirate", weights=V2)

    def load(path: Path) -> list[str]:
        return ["lora", "load", "pirate", f"file://{path}", "--worker", worker.url, "--json"]

    assert await asyncio.to_thread(lorafleet, load(old)) == 0

    assert await asyncio.to_thread(lorafleet, load(new)) == 1
    assert "replace" in capsys.readouterr().out
    assert await _digests(worker) == {"pirate": adapter_digest(weights=V1)}
    assert await asyncio.to_thread(lorafleet, [*load(new), "--replace"]) == 0
    assert await _digests(worker) == {"pirate": adapter_digest(weights=V2)}
    assert lorafleet(["lora", "unload", "pirate", "--replace"]) == 2  # not ignored
