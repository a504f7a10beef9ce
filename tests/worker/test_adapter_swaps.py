"""Swapping an adapter's version on a mocker worker: make before break, no dropped request.

A client loops over NATS on the adapter while it is swapped (vLLM's ``load_inplace``,
our ``replace``); every answer must be a complete one. A failed swap leaves the old
version serving; the card's digest and ``lora_id`` follow the weights the engine holds.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import nats
import pytest

from bench._cluster import placeholder_weights
from lorafleet.proto.discovery import LoraInfo, decode_card, decode_instance
from lorafleet.proto.inference import ErrorChunk, GenerateRequest, SamplingParams
from lorafleet.proto.naming import lora_id
from tests.processes import ServiceProcess
from tests.worker.adapters import adapter_digest, make_adapter_dir
from tests.worker.streaming import stream

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WEIGHTS = {"v1": b"\\x01" * 16, "v2": b"\\x02" * 16}


@pytest.fixture
def versions(tmp_path: Path) -> dict[str, str]:
    """Two versions of adapter ``swap`` (other weights), as plain paths for vLLM's routes."""
    return {
        version: str(make_adapter_dir(tmp_path / version, "swap", weights=weights))
        for version, weights in WEIGHTS.items()
    }


@pytest.fixture
def swap_worker(worker_factory, tmp_path: Path):
    def start(*args: str) -> ServiceProcess:
        env = {
            "DYN_LORA_ENABLED": "true",
            "DYN_LORA_PATH": str(tmp_path / "cache"),
            "DYN_SYSTEM_AUTH_TOKEN": TOKEN,
        }
        return worker_factory("--enable-lora", *args, env=env)

    return start


async def _card(etcd, namespace: str, name: str) -> LoraInfo | None:
    listing = await etcd.get_prefix(f"v1/mdc/{namespace}/".encode())
    cards = [decode_card(kv.value).lora for kv in listing]
    return next((lora for lora in cards if lora and lora.name == name), None)


async def _subject(etcd, namespace: str) -> str:
    (kv,) = list(await etcd.get_prefix(f"v1/instances/{namespace}/".encode()))
    return decode_instance(kv.value).subject


class ClientLoop:
    """Requests to one model, one after another, until stopped; keeps every error."""

    def __init__(self, nc: nats.aio.client.Client, subject: str, model: str) -> None:
        self.errors: list[str] = []
        self.served = 0
        self._progress = asyncio.Event()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run(nc, subject, model))

    async def _run(self, nc: nats.aio.client.Client, subject: str, model: str) -> None:
        sampling = SamplingParams(max_tokens=4)
        while not self._stop.is_set():
            request = GenerateRequest(request_id=f"r{self.served}", model=model, sampling=sampling)
            chunks = await stream(nc, subject, request, timeout_s=30)
            if isinstance(chunks[-1], ErrorChunk):
                self.errors.append(chunks[-1].error.message)
            self.served += 1
            self._progress.set()

    async def more(self, count: int) -> None:
        """Wait until ``count`` more requests have been answered."""
        target = self.served + count
        while self.served < target:
            self._progress.clear()
            await asyncio.wait_for(self._progress.wait(), 30)

    async def stop(self) -> list[str]:
        """Stop after the running request; the errors seen."""
        self._stop.set()
        await asyncio.wait_for(self._task, 30)
        return self.errors


async def _vllm_load(client: httpx.AsyncClient, path: str, inplace: bool = False) -> httpx.Response:
    body = {"lora_name": "swap", "lora_path": path, "load_inplace": inplace}
    return await client.post("/v1/load_lora_adapter", json=body)


async def test_a_failed_load_inplace_keeps_the_old_version_serving(
    swap_worker, versions, etcd, nc, namespace
) -> None:
    worker = swap_worker("--mocker-time-per-token-s", "0.005")
    async with httpx.AsyncClient(base_url=worker.url, headers=AUTH) as client:
        assert (await _vllm_load(client, versions["v1"])).status_code == 200
        loop = ClientLoop(nc, await _subject(etcd, namespace), "swap")
        await loop.more(3)
        failed = await _vllm_load(client, "/nonexistent/adapter", inplace=True)
        assert failed.status_code == 404, failed.text
        message = failed.json()["error"]["message"]
        assert "fetch step failed" in message and "keeps serving" in message
        await loop.more(3)
        assert await loop.stop() == []
        listed = (await client.get("/v1/loras")).json()
    assert listed["digests"] == {"swap": adapter_digest(weights=WEIGHTS["v1"])}
    card = await _card(etcd, namespace, "swap")
    assert card is not None and card.uri == f"file://{versions['v1']}"


async def test_swaps_under_a_client_loop_drop_no_request(
    swap_worker, versions, etcd, nc, namespace
) -> None:
    worker = swap_worker("--mocker-time-per-token-s", "0.005")
    async with httpx.AsyncClient(base_url=worker.url, headers=AUTH) as client:
        assert (await _vllm_load(client, versions["v1"])).status_code == 200
        loop = ClientLoop(nc, await _subject(etcd, namespace), "swap")
        for version in ["v2", "v1", "v2", "v1", "v2"]:
            await loop.more(2)
            swapped = await _vllm_load(client, versions[version], inplace=True)
            assert swapped.status_code == 200, swapped.text
            card = await _card(etcd, namespace, "swap")
            assert card is not None and card.digest == adapter_digest(weights=WEIGHTS[version])
        await loop.more(2)
        assert await loop.stop() == []


async def test_the_digest_and_lora_id_follow_the_weights(
    swap_worker, versions, etcd, namespace
) -> None:
    worker = swap_worker()
    async with httpx.AsyncClient(base_url=worker.url, headers=AUTH) as client:
        assert (await _vllm_load(client, versions["v1"])).status_code == 200
        first = await _card(etcd, namespace, "swap")
        assert (await _vllm_load(client, versions["v2"], inplace=True)).status_code == 200
        second = await _card(etcd, namespace, "swap")
        listed = (await client.post("/engine/update/list_loras", json={})).json()
    assert first is not None and second is not None
    assert first.digest == adapter_digest(weights=WEIGHTS["v1"]) != second.digest
    assert second.digest == adapter_digest(weights=WEIGHTS["v2"])
    assert first.lora_id == lora_id("swap", first.digest) != second.lora_id
    assert listed["loras"] == {"swap": second.lora_id}
    assert listed["digests"] == {"swap": second.digest}


async def test_a_swap_to_the_same_weights_changes_nothing_and_says_so(
    swap_worker, versions, tmp_path, etcd, namespace
) -> None:
    copy = make_adapter_dir(tmp_path / "copy", "swap", weights=WEIGHTS["v1"])
    worker = swap_worker()
    async with httpx.AsyncClient(base_url=worker.url, headers=AUTH) as client:
        assert (await _vllm_load(client, versions["v1"])).status_code == 200
        before = await _card(etcd, namespace, "swap")
        body = {"lora_name": "swap", "source": {"uri": f"file://{copy}"}, "replace": True}
        same = await client.post("/engine/update/load_lora", json=body)
    assert same.status_code == 200, same.text
    assert "nothing changed" in same.json()["message"]
    assert await _card(etcd, namespace, "swap") == before


async def test_no_free_slot_is_429_with_retry_after_and_the_old_version_serves(
    swap_worker, versions, etcd, nc, namespace
) -> None:
    """One slot, held by ``swap`` while a request runs on it: the swap cannot load the new
    version beside it, and says when to try again."""
    worker = swap_worker("--max-loras", "1", "--mocker-time-per-token-s", "0.05")
    async with httpx.AsyncClient(base_url=worker.url, headers=AUTH) as client:
        assert (await _vllm_load(client, versions["v1"])).status_code == 200
        started = asyncio.Event()
        request = GenerateRequest(request_id="long", model="swap",
                                  sampling=SamplingParams(max_tokens=100))  # fmt: skip
        subject = await _subject(etcd, namespace)
        running = asyncio.create_task(stream(nc, subject, request, 60, on_chunk=started.set))
        await started.wait()
        refused = await _vllm_load(client, versions["v2"], inplace=True)
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] == "1"
        assert "keeps serving" in refused.json()["error"]["message"]
        assert not isinstance((await running)[-1], ErrorChunk)
    card = await _card(etcd, namespace, "swap")
    assert card is not None and card.digest == adapter_digest(weights=WEIGHTS["v1"])


async def test_vllm_routes_answer_503_while_the_worker_stops(
    swap_worker, versions, etcd, nc, namespace
) -> None:
    worker = swap_worker("--mocker-time-per-token-s", "0.05")
    request = GenerateRequest(request_id="r", model="demo", sampling=SamplingParams(max_tokens=60))
    started = asyncio.Event()
    subject = await _subject(etcd, namespace)
    running = asyncio.create_task(stream(nc, subject, request, 60, on_chunk=started.set))
    await started.wait()
    worker.process.send_signal(signal.SIGTERM)
    async with httpx.AsyncClient(base_url=worker.url, headers=AUTH) as client:
        async with asyncio.timeout(10):
            while (await client.get("/health")).status_code != 503:
                await asyncio.sleep(0.05)
        load = await _vllm_load(client, versions["v1"])
        unload = await client.post("/v1/unload_lora_adapter", json={"lora_name": "swap"})
    for refused in (load, unload):
        assert refused.status_code == 503, refused.text
        assert "shutting down" in refused.json()["error"]["message"]
    await running


async def test_a_load_of_changed_files_under_the_same_path_swaps_to_them(
    swap_worker, versions, etcd, namespace
) -> None:
    """``file://`` is read in place: new weights written over the old ones are a new
    version, and loading the same path again swaps to it."""
    worker = swap_worker()
    body = {"lora_name": "swap", "source": {"uri": f"file://{versions['v1']}"}}
    async with httpx.AsyncClient(base_url=worker.url, headers=AUTH) as client:
        assert (await client.post("/v1/loras", json=body)).status_code == 200
        (Path(versions["v1"]) / "adapter_model.safetensors").write_bytes(
            placeholder_weights(WEIGHTS["v2"])
        )
        again = await client.post("/v1/loras", json=body)
    assert again.status_code == 200, again.text
    assert "swapped" in again.json()["message"]
    card = await _card(etcd, namespace, "swap")
    assert card is not None and card.digest == again.json()["digest"]
    assert card.digest == adapter_digest(weights=WEIGHTS["v2"])
