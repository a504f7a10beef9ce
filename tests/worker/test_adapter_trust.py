"""What a real mocker worker refuses to load: pickled weights (unless allowed), adapters over
the size bound, and weights that are no whole safetensors file by their bytes, before the engine
sees a byte; nothing of them stays in the cache."""

from __future__ import annotations

from pathlib import Path

import httpx
import msgspec
import pytest

from lorafleet.discovery.keys import adapter_key
from lorafleet.proto.adapters import AdapterSpec, LoraSource
from lorafleet.proto.naming import lora_slug
from tests.processes import ServiceProcess
from tests.worker.adapters import lying_adapters, make_adapter_dir
from tests.worker.fleet import wait_for_records


def _pickled_adapter(root: Path, name: str) -> str:
    path = make_adapter_dir(root, name)
    (path / "adapter_model.safetensors").rename(path / "adapter_model.bin")
    return f"file://{path}"


@pytest.fixture
def lora_worker(worker_factory, tmp_path: Path):
    def start(env: dict[str, str] | None = None) -> ServiceProcess:
        full_env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
        return worker_factory("--enable-lora", env={**full_env, **(env or {})})

    return start


async def _load(worker: ServiceProcess, name: str, uri: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as client:
        body = {"lora_name": name, "source": {"uri": uri}}
        return await client.post("/engine/update/load_lora", json=body)


async def _loaded(worker: ServiceProcess) -> set[str]:
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as client:
        response = await client.post("/engine/update/list_loras", json={})
    return set(response.json()["loras"])


async def test_a_pickled_adapter_is_refused_by_default_naming_the_setting(
    lora_worker, tmp_path: Path
) -> None:
    worker = lora_worker()
    response = await _load(worker, "pickled", _pickled_adapter(tmp_path / "ad", "pickled"))
    assert response.status_code == 400, response.text
    assert "pickle" in response.json()["message"]
    assert "DYN_LORA_ALLOW_PICKLE=true" in response.json()["message"]
    assert "pickled" not in await _loaded(worker)


async def test_a_pickled_adapter_loads_when_the_operator_allows_pickles(
    lora_worker, tmp_path: Path
) -> None:
    worker = lora_worker({"DYN_LORA_ALLOW_PICKLE": "true"})
    response = await _load(worker, "pickled", _pickled_adapter(tmp_path / "ad", "pickled"))
    assert response.status_code == 200, response.text
    assert "pickled" in await _loaded(worker)


async def test_an_adapter_over_the_size_bound_is_refused_and_the_others_still_load(
    lora_worker, tmp_path: Path
) -> None:
    worker = lora_worker({"DYN_LORA_MAX_BYTES": "4096"})
    big = make_adapter_dir(tmp_path / "ad", "big", weights=bytes(8192))
    response = await _load(worker, "big", f"file://{big}")
    assert response.status_code == 400, response.text
    assert "DYN_LORA_MAX_BYTES" in response.json()["message"]
    small = make_adapter_dir(tmp_path / "ad", "small")
    assert (await _load(worker, "small", f"file://{small}")).status_code == 200
    assert await _loaded(worker) == {"small"}


async def test_a_declared_adapter_refused_for_size_is_not_retried_by_placement(
    lora_worker, tmp_path: Path, etcd, namespace
) -> None:
    """Placement retried an archive bomb 6 times in 38 s: a refusal for size now says, in
    the load record /v1/adapters shows, that no retry is due (until the source changes)."""
    lora_worker({"DYN_LORA_MAX_BYTES": "4096"})
    big = make_adapter_dir(tmp_path / "ad", "big", weights=bytes(8192))
    spec = AdapterSpec(name="big", base_model="demo", source=LoraSource(uri=f"file://{big}"))
    await etcd.put(adapter_key(namespace, lora_slug("big")).encode(), msgspec.json.encode(spec))

    def failed(records) -> bool:
        return any("big" in record.failed for record in records.values())

    (record,) = (await wait_for_records(etcd, namespace, failed, timeout_s=60)).values()
    failure = record.failed["big"]
    assert failure.code == "invalid_request" and "DYN_LORA_MAX_BYTES" in failure.message
    assert failure.retry_at == 0.0 and failure.attempts == 1


async def test_weights_that_are_no_safetensors_by_their_bytes_are_refused_whatever_their_name(
    lora_worker, tmp_path: Path
) -> None:
    """A header claiming 2^40 bytes, tensors claiming 2^40 bytes, /etc/passwd linked as the
    weights (this worker has no file roots, so the link is followed): each a 400 naming the
    adapter and the file, and the engine never has it."""
    worker = lora_worker()
    for path, problem in lying_adapters(tmp_path / "ad").items():
        response = await _load(worker, path.name, f"file://{path}")
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "invalid_request"
        assert problem in response.json()["message"] and response.json()["lora_name"] == path.name
    good = make_adapter_dir(tmp_path / "ad", "good")
    assert (await _load(worker, "good", f"file://{good}")).status_code == 200
    assert await _loaded(worker) == {"good"}
