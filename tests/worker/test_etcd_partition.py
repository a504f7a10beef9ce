"""A real worker whose link to etcd drops while NATS stays up (issue 27, case 1).

A ``TcpProxy`` stands between the worker and etcd; the test reads etcd directly.
Every wait is for an event (a health answer, a log line, a key); the lease TTL is
the processes' default in tests (2 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from lorafleet.proto.discovery import decode_instance
from lorafleet.proto.inference import ErrorChunk, GenerateRequest
from lorafleet.proto.naming import lora_id
from tests.faults import TcpProxy
from tests.processes import ServiceProcess
from tests.worker.adapters import make_adapter_dir
from tests.worker.streaming import stream
from tests.worker.test_lora_lifecycle import DIGEST, LORA_ENV, assert_invariant

HEAL_TIMEOUT_S = 30


@pytest.fixture
async def etcd_proxy(etcd_url: str) -> AsyncIterator[TcpProxy]:
    proxy = await TcpProxy(int(etcd_url.rsplit(":", 1)[1])).start()
    yield proxy
    await proxy.aclose()


async def _start_behind(
    worker_factory, proxy: TcpProxy, tmp_path: Path, **kwargs
) -> ServiceProcess:
    """A LoRA worker whose every etcd connection goes through ``proxy``; started in a
    thread, since the proxy lives on this event loop, which must keep running."""
    env = {**LORA_ENV, "DYN_LORA_PATH": str(tmp_path / "cache"), "ETCD_ENDPOINTS": proxy.url}
    return await asyncio.to_thread(
        worker_factory, "--enable-lora", "--max-loras", "4", env=env, **kwargs
    )


async def _health_until(client: httpx.AsyncClient, status_code: int) -> dict:
    async with asyncio.timeout(HEAL_TIMEOUT_S):
        while (response := await client.get("/health")).status_code != status_code:
            await asyncio.sleep(0.1)
    return response.json()


async def _instance_keys(etcd, namespace: str, instance_id: str) -> list[str]:
    keys = []
    for root in ("v1/instances/", "v1/mdc/"):
        listing = await etcd.get_prefix(f"{root}{namespace}/".encode())
        keys += [kv.key.decode() for kv in listing if kv.key.decode().endswith(instance_id)
                 or f"/{instance_id}/" in kv.key.decode()]  # fmt: skip
    return keys


async def test_worker_cut_from_etcd_says_so_and_republishes_on_heal(
    worker_factory, etcd, etcd_proxy, nc, namespace, tmp_path
):
    worker = await _start_behind(worker_factory, etcd_proxy, tmp_path)
    pirate = f"file://{make_adapter_dir(tmp_path / 'adapters', 'pirate')}"
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:
        body = {"lora_name": "pirate", "source": {"uri": pirate}}
        assert (await client.post("/engine/update/load_lora", json=body)).status_code == 200
        instance_id = (await client.get("/health")).json()["instance_id"]
        (record,) = await etcd.get_prefix(f"v1/instances/{namespace}/".encode())
        subject = decode_instance(record.value).subject

        etcd_proxy.cut()
        health = await _health_until(client, 503)
        assert health["etcd"] == "lease expired" and "etcd" in health["message"]
        async with asyncio.timeout(HEAL_TIMEOUT_S):  # etcd drops the records with the lease
            while await _instance_keys(etcd, namespace, instance_id):
                await asyncio.sleep(0.1)

        etcd_proxy.restore()
        health = await _health_until(client, 200)
        assert health["etcd"] == "lease held" and health["instance_id"] == instance_id
        await assert_invariant(client, etcd, namespace)
        assert (await client.post("/engine/update/list_loras", json={})).json()["loras"] == {
            "pirate": lora_id("pirate", DIGEST)
        }
        keys = await _instance_keys(etcd, namespace, instance_id)
        assert len(keys) == 3, keys  # instance record, base card, the pirate card
        served = await stream(nc, subject, GenerateRequest(request_id="again", model="pirate"))
        assert not isinstance(served[-1], ErrorChunk), served[-1]


async def test_etcd_cut_during_a_start_up_step_is_waited_for_not_fatal(
    worker_factory, etcd_proxy, tmp_path
):
    # The first listing of the fleet's desired adapters (placement's start) meets the cut,
    # after the connection, the lease and the base card all went through.
    etcd_proxy.cut_when_sent(b"v1/adapters/")
    worker = await _start_behind(worker_factory, etcd_proxy, tmp_path, wait=False)
    await etcd_proxy.was_cut.wait()
    await asyncio.to_thread(worker.wait_for_log, "waiting for etcd")
    etcd_proxy.restore()
    health = await asyncio.to_thread(worker.wait_ready)
    assert health["status"] == "ready" and health["etcd"] == "lease held"
