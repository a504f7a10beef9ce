"""Helpers for fleet placement tests: what etcd shows, waited for, and the lifecycle invariant."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx
import msgspec

from lorafleet.discovery.keys import adapter_key, load_prefix
from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.proto.adapters import AdapterSpec, LoraSource
from lorafleet.proto.discovery import decode_card
from lorafleet.proto.fleet_load import InstanceLoad, decode_instance_load
from lorafleet.proto.naming import lora_slug
from tests.processes import ServiceProcess
from tests.worker.adapters import make_adapter_dir

Holders = dict[str, set[int]]


async def put_spec(
    etcd, namespace: str, root: Path, name: str, *, base_model: str = "demo", rank: int = 8,
    **bounds: object,
) -> AdapterSpec:  # fmt: skip
    """Write ``name``'s desired state (an adapter directory under ``root`` of LoRA ``rank``,
    for ``base_model``) into etcd."""
    uri = f"file://{make_adapter_dir(root, name, base_model, rank=rank)}"
    spec = AdapterSpec(name=name, base_model=base_model, source=LoraSource(uri=uri), **bounds)
    await etcd.put(adapter_key(namespace, lora_slug(name)).encode(), msgspec.json.encode(spec))
    return spec


async def holders(etcd, namespace: str) -> tuple[Holders, set[int]]:
    """Adapter name -> instances with its card, and the instances with a base card."""
    where: Holders = defaultdict(set)
    bases = set()
    for kv in await etcd.get_prefix(f"v1/mdc/{namespace}/".encode()):
        card = decode_card(kv.value)
        instance = int(kv.key.decode().split("/")[5], 16)
        if card.lora:
            where[card.lora.name].add(instance)
        else:
            bases.add(instance)
    return dict(where), bases


async def load_records(etcd, namespace: str) -> dict[int, InstanceLoad]:
    """Instance -> its load record."""
    records = await etcd.get_prefix(load_prefix(namespace).encode())
    return {_instance_of(kv.key.decode()): decode_instance_load(kv.value) for kv in records}


async def wait_for_records(
    etcd,
    namespace: str,
    done: Callable[[dict[int, InstanceLoad]], bool],
    timeout_s: float = 10,
) -> dict[int, InstanceLoad]:
    """Instance -> its load record, once ``done`` holds of them: woken by etcd's watch on
    every rewrite of a record, not by a poll."""
    cache = await WatchCache.start(etcd, load_prefix(namespace), decode_instance_load)

    def by_instance(items: Mapping[str, InstanceLoad]) -> dict[int, InstanceLoad]:
        return {_instance_of(key): record for key, record in items.items()}

    try:
        await cache.wait_until(lambda items: done(by_instance(items)), timeout_s)
        return by_instance(cache.items)
    finally:
        await cache.aclose()


def _instance_of(key: str) -> int:
    """The instance id at the end of a load record's key."""
    return int(key.rsplit("/", 1)[1], 16)


async def wait_for_holders(
    etcd, namespace: str, done: Callable[[Holders, set[int]], bool], timeout_s: float
) -> Holders:
    """Poll etcd until ``done(holders, bases)``; fail after ``timeout_s``, showing the last."""
    where: Holders = {}
    bases: set[int] = set()
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                where, bases = await holders(etcd, namespace)
                if done(where, bases):
                    return where
                await asyncio.sleep(0.1)
    except TimeoutError:
        shown = {name: sorted(f"{i:x}" for i in on) for name, on in sorted(where.items())}
        raise AssertionError(
            f"not reached in {timeout_s} s: bases {sorted(bases)}, {shown}"
        ) from None


def per_instance(where: Holders) -> dict[int, int]:
    """Instance -> how many adapters it holds."""
    counts: dict[int, int] = defaultdict(int)
    for instances in where.values():
        for instance in instances:
            counts[instance] += 1
    return dict(counts)


async def instance_id(worker: ServiceProcess) -> int:
    """The worker's instance id (its lease), from its health route."""
    async with httpx.AsyncClient(base_url=worker.url) as client:
        return int((await client.get("/health")).json()["instance_id"], 16)


async def assert_invariant_everywhere(
    workers: Sequence[ServiceProcess], etcd, namespace: str
) -> None:
    """On every worker, a card is in etcd exactly for the adapters the engine has loaded."""
    where, _ = await holders(etcd, namespace)
    for worker in workers:
        async with httpx.AsyncClient(base_url=worker.url) as client:
            health = (await client.get("/health")).json()
            loaded = (await client.post("/engine/update/list_loras", json={})).json()["loras"]
        instance = int(health["instance_id"], 16)
        carded = {name for name, on in where.items() if instance in on}
        assert carded == set(loaded), f"worker {instance:x}"
