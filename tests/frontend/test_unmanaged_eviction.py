"""Unmanaged adapters and eviction with real mocker workers, a real frontend, etcd and NATS.

An adapter loaded straight onto a worker is not in the desired state. When a load needs
its slot and it is idle, the worker evicts it and says so in its load record
(``evicted``) before its card goes; the frontend then loads it back on demand from that
source, so a client looping on it never gets a 404. A busy one is never evicted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from lorafleet.proto.fleet_load import InstanceLoad
from tests.frontend.conftest import FAST_DISPATCH, RunningFrontend, run_frontend, wait_for_models
from tests.processes import ServiceProcess
from tests.worker.adapters import adapter_digest, make_adapter_dir
from tests.worker.fleet import wait_for_records

pytestmark = pytest.mark.slow


@pytest.fixture
async def frontend(etcd_url: str, nats_url: str, namespace: str) -> AsyncIterator[RunningFrontend]:
    config = FrontendConfig(namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url, dispatch=FAST_DISPATCH)  # fmt: skip
    async with run_frontend(config) as running:
        yield running


async def _load_straight(worker: ServiceProcess, name: str, root: Path) -> httpx.Response:
    """Load ``name`` onto the worker itself (not declared: unmanaged)."""
    uri = f"file://{make_adapter_dir(root, name)}"
    async with httpx.AsyncClient(timeout=60) as http:
        body = {"lora_name": name, "source": {"uri": uri}}
        return await http.post(f"{worker.url}/engine/update/load_lora", json=body)


async def _chat(client: openai.AsyncOpenAI, model: str, **extra: object) -> str:
    answer = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, **extra
    )
    return answer.model


def _old_evicted(records: dict[int, InstanceLoad]) -> bool:
    return any("old" in record.evicted for record in records.values())


async def test_an_idle_unmanaged_adapter_that_is_evicted_is_reported_and_loads_back(
    lora_workers, frontend: RunningFrontend, etcd, namespace: str, tmp_path: Path
) -> None:
    (worker,) = await asyncio.to_thread(lora_workers, 1, "--max-loras", "2")
    await wait_for_models(frontend, {"demo"}, timeout_s=30)
    root = tmp_path / "adapters"
    for name in ("old", "a", "b"):  # two slots: "b" takes the least recently loaded, "old"
        assert (await _load_straight(worker, name, root)).status_code == 200

    records = await wait_for_records(etcd, namespace, _old_evicted)
    (gone,) = [record.evicted["old"] for record in records.values()]
    assert gone.uri == f"file://{root / 'old'}" and gone.digest == adapter_digest()
    assert gone.reason == "its slot went to unmanaged adapter 'b'"
    listed = (await frontend.http.get("/v1/adapters/old")).json()
    assert (listed["state"], listed["digest"]) == ("evicted", adapter_digest())

    async with openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="-") as client:
        assert await _chat(client, "old") == "old"  # loaded back from its source
    await wait_for_records(etcd, namespace, lambda records: not _old_evicted(records))


async def test_a_busy_unmanaged_adapter_keeps_its_slot_while_loads_need_it(
    lora_workers, frontend: RunningFrontend, etcd, namespace: str, tmp_path: Path
) -> None:
    (worker,) = await asyncio.to_thread(
        lora_workers, 1, "--max-loras", "1", "--mocker-time-per-token-s", "0.05"
    )
    await wait_for_models(frontend, {"demo"}, timeout_s=30)
    root = tmp_path / "adapters"
    assert (await _load_straight(worker, "old", root)).status_code == 200
    await wait_for_models(frontend, {"demo", "old"}, timeout_s=30)

    async with openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="-") as client:
        stream = await client.chat.completions.create(
            model="old", messages=[{"role": "user", "content": "hi"}], max_tokens=200, stream=True
        )
        async with stream:
            first = await anext(aiter(stream))  # the request runs on "old" now
            assert first.model == "old"
            refused = await _load_straight(worker, "new", root)
            assert refused.status_code == 429, refused.text
            assert "pinned or busy" in refused.json()["message"]
            assert "old" in [model.id for model in (await client.models.list()).data]
            assert [c.choices[0].delta.content async for c in stream]  # it ran to the end

    records = await wait_for_records(etcd, namespace, lambda r: bool(r))
    assert all(not record.evicted for record in records.values())


async def test_loading_more_adapters_than_slots_while_a_client_loops_on_an_older_one_never_404s(
    lora_workers, frontend: RunningFrontend, tmp_path: Path
) -> None:
    """One slot, and ``--lora-in-use-s 0`` so the looped-on adapter is evicted whenever it is
    idle at a load: every load takes its slot, and each of its next requests loads it back.
    A load back that meets another load holding the one slot is a 429 with Retry-After (the
    worker's honest answer, which OpenAI's client retries); never a 404 or a 5xx."""
    (worker,) = await asyncio.to_thread(lora_workers, 1, "--max-loras", "1", "--lora-in-use-s", "0")
    await wait_for_models(frontend, {"demo"}, timeout_s=30)
    root = tmp_path / "adapters"
    assert (await _load_straight(worker, "old", root)).status_code == 200
    await wait_for_models(frontend, {"demo", "old"}, timeout_s=30)
    outcomes: Counter[str] = Counter()

    async def loop(client: openai.AsyncOpenAI) -> None:
        while True:
            try:
                outcomes[await _chat(client, "old")] += 1
            except openai.RateLimitError as exc:  # a load back met another load's slot
                outcomes[f"429, Retry-After: {exc.response.headers.get('retry-after')}"] += 1
            except openai.APIStatusError as exc:
                outcomes[f"{exc.status_code} {exc.message}"] += 1

    loads: Counter[int] = Counter()
    async with openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="-",
                                  max_retries=0) as client:  # fmt: skip
        task = asyncio.create_task(loop(client))
        try:
            for i in range(6):
                while (status := (await _load_straight(worker, f"n{i}", root)).status_code) == 429:
                    loads[429] += 1  # "old" was running a request at that instant
                    await asyncio.sleep(0.05)
                loads[status] += 1
                before = outcomes["old"]
                async with asyncio.timeout(30):  # "old" answers again: it was loaded back
                    while outcomes["old"] == before:
                        await asyncio.sleep(0.01)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    assert loads[200] == 6, loads
    assert set(outcomes) <= {"old", "429, Retry-After: 1"}, outcomes
