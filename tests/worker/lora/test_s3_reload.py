"""A real mocker worker loading from S3 (a moto server) while the object under one URI changes.

A plain load of a cached copy is served from the cache with no request for an object. An
explicit reload (``replace``, vLLM's ``load_inplace``) asks S3 for the objects' ETags first:
unchanged, nothing is fetched and nothing changes; changed, the new objects are fetched and
the worker swaps to them. vLLM's ``load_inplace`` of the same URI through the frontend has
every holder reload it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from lorafleet.worker.lora.digest import content_digest
from tests.frontend.conftest import FAST_DISPATCH, run_frontend, wait_for_models


def _object_reads(requests: list[str]) -> list[str]:
    """The GETs of objects (a listing is a GET of the bucket with ``list-type``)."""
    return [r for r in requests if r.startswith("GET ") and "list-type=" not in r]


async def test_a_reload_of_a_changed_s3_object_fetches_it_and_a_plain_load_hits_the_cache(
    worker_factory, tmp_path: Path, aws_env: Any, upload: Callable[..., str],
    make_adapter: Callable[..., Path], adapter_bytes: Callable[..., dict[str, bytes]],
) -> None:  # fmt: skip
    env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
    worker = worker_factory("--enable-lora", env=env)
    uri = upload("adapters/pirate")
    first = content_digest(make_adapter(tmp_path / "v1"))
    second = content_digest(make_adapter(tmp_path / "v2", adapter_bytes(rank=2)))
    load = {"lora_name": "pirate", "source": {"uri": uri}}
    reload = {**load, "replace": True}
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as client:
        loaded = await client.post("/engine/update/load_lora", json=load)
        assert (loaded.status_code, loaded.json()["digest"]) == (200, first), loaded.text
        unloaded = await client.post("/engine/update/unload_lora", json={"lora_name": "pirate"})
        assert unloaded.status_code == 200, unloaded.text

        aws_env.reset_requests()
        again = await client.post("/engine/update/load_lora", json=load)
        assert (again.status_code, again.json()["digest"]) == (200, first), again.text
        assert aws_env.requests() == []  # a plain load: the cache answers, S3 is not asked

        same = await client.post("/engine/update/load_lora", json=reload)
        assert same.status_code == 200, same.text
        assert "nothing changed" in same.json()["message"]
        assert aws_env.requests() and _object_reads(aws_env.requests()) == []  # listed only

        upload("adapters/pirate", adapter_bytes(rank=2))  # new objects under the same keys
        aws_env.reset_requests()
        swapped = await client.post("/engine/update/load_lora", json=reload)
        assert swapped.status_code == 200, swapped.text
        assert f"swapped from {first} to {second}" in swapped.json()["message"]
        assert _object_reads(aws_env.requests())
        listed = (await client.post("/engine/update/list_loras", json={})).json()
    assert listed["digests"] == {"pirate": second}


async def _digests(url: str) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        listed = (await client.post("/engine/update/list_loras", json={})).json()
    return dict(listed["digests"])


async def test_a_fleet_wide_load_inplace_of_a_changed_s3_object_swaps_every_holder_to_it(
    worker_factory, tmp_path: Path, aws_env: Any, upload: Callable[..., str],
    make_adapter: Callable[..., Path], adapter_bytes: Callable[..., dict[str, bytes]],
    etcd_url: str, nats_url: str, namespace: str,
) -> None:  # fmt: skip
    env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
    workers = [worker_factory("--enable-lora", env=env) for _ in range(2)]
    uri = upload("adapters/fx")
    first = content_digest(make_adapter(tmp_path / "v1"))
    second = content_digest(make_adapter(tmp_path / "v2", adapter_bytes(rank=2)))
    config = FrontendConfig(namespace=namespace, etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url, dispatch=FAST_DISPATCH)  # fmt: skip
    async with run_frontend(config) as frontend:
        await wait_for_models(frontend, {"demo"}, timeout_s=30)
        body = {"lora_name": "fx", "lora_path": uri}
        loaded = await frontend.http.post("/v1/load_lora_adapter", json=body, timeout=60)
        assert loaded.status_code == 200, loaded.text
        async with asyncio.timeout(60):  # replicas "all": placement adds the second copy
            while len(getattr(frontend.registry.get("fx"), "instances", ())) < 2:
                await asyncio.sleep(0.1)
        assert [await _digests(w.url) for w in workers] == [{"fx": first}] * 2

        upload("adapters/fx", adapter_bytes(rank=2))
        inplace = {**body, "load_inplace": True}
        reloaded = await frontend.http.post("/v1/load_lora_adapter", json=inplace, timeout=60)
        assert reloaded.status_code == 200, reloaded.text

    # vLLM's answer comes once one worker holds the new version; every holder follows
    async with asyncio.timeout(60):
        while (held := [await _digests(w.url) for w in workers]) != [{"fx": second}] * 2:
            assert all(d.get("fx") in (first, second) for d in held), held  # never dropped
            await asyncio.sleep(0.1)
