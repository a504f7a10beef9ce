"""Fleet placement across real mocker workers: desired state in etcd, no coordinator."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

import httpx
import msgspec
import pytest

from discovery.keys import adapter_key
from proto.adapters import AdapterSpec, LoraSource
from proto.discovery import decode_card
from proto.naming import lora_slug
from proto.placement import chosen_instances
from tests.worker.adapters import make_adapter_dir

NAMES = [f"fleet{i}" for i in range(10)]
TTL_S = 2


@pytest.fixture
async def specs(etcd, namespace, tmp_path: Path) -> list[AdapterSpec]:
    """Ten adapters at replicas 2, written as desired state."""
    written = []
    for name in NAMES:
        uri = f"file://{make_adapter_dir(tmp_path / 'adapters', name)}"
        spec = AdapterSpec(name=name, base_model="demo", source=LoraSource(uri=uri), replicas=2)
        await etcd.put(adapter_key(namespace, lora_slug(name)).encode(), msgspec.json.encode(spec))
        written.append(spec)
    return written


@pytest.fixture
def fleet_worker(worker_factory, tmp_path: Path):
    def start(**kwargs):
        env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
        return worker_factory("--enable-lora", "--max-loras", "10", env=env, **kwargs)

    return start


async def _holders(etcd, namespace: str) -> tuple[dict[str, set[int]], set[int]]:
    """Adapter name -> instances with its card, and the instances with a base card."""
    holders: dict[str, set[int]] = defaultdict(set)
    bases = set()
    for kv in await etcd.get_prefix(f"v1/mdc/{namespace}/".encode()):
        card = decode_card(kv.value)
        instance = int(kv.key.decode().split("/")[5], 16)
        if card.lora:
            holders[card.lora.name].add(instance)
        else:
            bases.add(instance)
    return dict(holders), bases


async def _converged(etcd, namespace: str, timeout_s: float, instances: int) -> dict[str, set[int]]:
    """Wait until ``instances`` live instances hold every adapter exactly where placement says."""
    async with asyncio.timeout(timeout_s):
        while True:
            holders, bases = await _holders(etcd, namespace)
            expected = {name: set(chosen_instances(name, 2, bases)) for name in NAMES}
            if len(bases) == instances and holders == expected:
                return holders
            await asyncio.sleep(0.1)


async def _assert_invariant_everywhere(workers, etcd, namespace: str) -> None:
    holders, _ = await _holders(etcd, namespace)
    for worker in workers:
        async with httpx.AsyncClient(base_url=worker.url) as client:
            health = (await client.get("/health")).json()
            loaded = (await client.post("/engine/update/list_loras", json={})).json()["loras"]
        instance = int(health["instance_id"], 16)
        carded = {name for name, where in holders.items() if instance in where}
        assert carded == set(loaded), f"worker {instance:x}"


async def test_fleet_places_each_adapter_on_two_instances_and_heals(
    fleet_worker, specs, etcd, namespace
):
    workers = [await asyncio.to_thread(fleet_worker) for _ in range(3)]
    placed = await _converged(etcd, namespace, timeout_s=20, instances=3)
    assert all(len(where) == 2 for where in placed.values())

    workers[0].kill()
    await _converged(etcd, namespace, timeout_s=TTL_S + 2, instances=2)

    before, bases_before = await _holders(etcd, namespace)
    workers.append(await asyncio.to_thread(fleet_worker))
    after = await _converged(etcd, namespace, timeout_s=20, instances=3)
    _, bases_after = await _holders(etcd, namespace)
    (newcomer_id,) = bases_after - bases_before
    moved = [name for name in NAMES if before[name] != after[name]]
    assert all(newcomer_id in after[name] for name in moved)
    assert all(len(before[name] - after[name]) == 1 for name in moved)  # one copy moved, not two

    await asyncio.to_thread(workers[1].terminate)
    workers[1] = await asyncio.to_thread(fleet_worker)  # restarted: reloads its share by itself
    await _converged(etcd, namespace, timeout_s=20, instances=3)
    await _assert_invariant_everywhere(workers[1:], etcd, namespace)
