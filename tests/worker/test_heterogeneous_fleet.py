"""Workers that differ: each adapter goes only where its rank and base model fit.

Real mocker workers with different ``--max-lora-rank`` and base models, a real frontend,
the desired state in etcd: placement and on-demand loads send no load that a worker must
refuse, and an adapter no live worker can take is ``unplaceable`` with the reason.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from lorafleet.launch.fleet_status import print_fleet
from tests.processes import ServiceProcess, start_frontend
from tests.worker.adapters import make_adapter_dir
from tests.worker.fleet import instance_id, load_records, put_spec, wait_for_holders

FAILED_LOAD = re.compile(r'lorafleet_worker_adapter_operations_total\{operation="load",'
                         r'outcome="(?!ok")[^"]+"\} [1-9]')  # fmt: skip
"""A worker's metric line counting a load that failed (any outcome but ok)."""


@pytest.fixture
def worker_with(worker_factory, tmp_path: Path):
    """Start a mocker worker serving ``model`` that takes adapters up to ``rank``."""

    def start(rank: int, model: str = "demo") -> ServiceProcess:
        env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / f"cache-{model}")}
        flags = ("--enable-lora", "--max-loras", "4", "--max-lora-rank", str(rank))
        return worker_factory(*flags, env=env, model=model)

    return start


def _failed_loads(worker: ServiceProcess) -> list[str]:
    """The worker's metric lines of failed loads (none when nothing was refused)."""
    return FAILED_LOAD.findall(httpx.get(f"{worker.url}/metrics").text)


async def test_a_rank_32_adapter_lands_on_the_rank_64_worker_with_any_replicas(
    worker_with, etcd, namespace, tmp_path: Path
) -> None:
    small = await asyncio.to_thread(worker_with, 8)
    large = await asyncio.to_thread(worker_with, 64)
    small_id, large_id = await instance_id(small), await instance_id(large)
    root = tmp_path / "adapters"
    for name, replicas in (("wide1", 1), ("wide2", 2), ("wideall", "all")):
        await put_spec(etcd, namespace, root, name, rank=32, replicas=replicas)
    await put_spec(etcd, namespace, root, "narrow", rank=8, replicas="all")

    def settled(where, bases) -> bool:
        wide = all(where.get(name) == {large_id} for name in ("wide1", "wide2", "wideall"))
        return wide and where.get("narrow") == {small_id, large_id}

    await wait_for_holders(etcd, namespace, settled, timeout_s=30)
    records = await load_records(etcd, namespace)
    assert records[small_id].failed == {}  # never tried where it cannot go
    assert _failed_loads(small) == [] and _failed_loads(large) == []


async def test_two_base_models_each_adapter_only_where_it_fits_or_unplaceable(
    worker_with, etcd, etcd_url, nats_url, namespace, tmp_path: Path, capsys
) -> None:
    frontend = await asyncio.to_thread(
        start_frontend, tmp_path, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace
    )
    workers = [await asyncio.to_thread(worker_with, *spec)
               for spec in ((8, "demo"), (64, "demo"), (8, "other"))]  # fmt: skip
    demo8, demo64, other8 = [await instance_id(worker) for worker in workers]
    root = tmp_path / "adapters"
    await put_spec(etcd, namespace, root, "huge", rank=128)  # no demo worker takes 128
    await put_spec(etcd, namespace, root, "otherwide", base_model="other", rank=32)
    await put_spec(etcd, namespace, root, "othercold", base_model="other", replicas=0)
    await put_spec(etcd, namespace, root, "demowide", rank=32, replicas="all")
    await put_spec(etcd, namespace, root, "demonarrow", replicas="all")

    def settled(where, _bases) -> bool:
        return where.get("demowide") == {demo64} and where.get("demonarrow") == {demo8, demo64}

    await wait_for_holders(etcd, namespace, settled, timeout_s=30)
    async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
        huge = (await http.get("/v1/adapters/huge")).json()
        otherwide = (await http.get("/v1/adapters/otherwide")).json()
        body = {"model": "huge", "prompt": "hi", "max_tokens": 2}
        refused = await http.post("/v1/completions", json=body)
        cold = await http.post("/v1/completions", json={**body, "model": "othercold"})
        models = {m["id"]: m.get("parent") for m in (await http.get("/v1/models")).json()["data"]}
        vllm_path = make_adapter_dir(root, "vllmwide", rank=32)  # vLLM's route: fits demo64
        vllm = await http.post(
            "/v1/load_lora_adapter",
            json={"lora_name": "vllmwide", "lora_path": str(vllm_path), "base_model_name": "demo"},
        )
    await asyncio.to_thread(print_fleet, frontend.url, as_json=False)
    listed = capsys.readouterr().out

    assert (huge["state"], otherwide["state"]) == ("unplaceable", "unplaceable")
    assert "rank 128" in huge["unplaceable"] and "at most 8, 64" in huge["unplaceable"]
    assert "at most 8 " in otherwide["unplaceable"]  # the demo workers' 64 does not count
    assert (refused.status_code, refused.json()["error"]["code"]) == (424, "adapter_unplaceable")
    assert cold.status_code == 200, cold.text  # loaded on demand, on its base's worker
    assert vllm.status_code == 200, vllm.text
    where = await wait_for_holders(etcd, namespace, lambda w, _b: "othercold" in w, timeout_s=10)
    assert (where["othercold"], where["vllmwide"]) == ({other8}, {demo64})
    assert {m: models.get(m) for m in ("demo", "other", "demowide", "othercold")} == {
        "demo": None,
        "other": None,
        "demowide": "demo",
        "othercold": "other",
    }
    assert re.search(r"huge\s+unplaceable\s.*rank 128", listed), listed
    records = await load_records(etcd, namespace)
    assert all(record.failed == {} for record in records.values())  # no doomed load
    assert [_failed_loads(worker) for worker in workers] == [[], [], []]
