"""Issue 27 at length: a worker, then a frontend, cut off from etcd; a stalled etcd member.

Each case runs three times and prints its figures for docs/faults.md.

Two mocker workers serve ``demo`` with ``pirate`` loaded; worker A reaches etcd only
through a ``TcpProxy``. Closed-loop chats run through a frontend while A's link is cut
for ``CUT_S`` and restored. Checked all along: no chat fails or gets another model's
answer, and no card in etcd names an adapter its worker does not hold. Measured: the
time from the cut until A's ``/health`` says 503 (detect) and from the restore until
its records are all back (heal). The figures are printed for docs/faults.md; the short
version is ``tests/worker/test_etcd_partition.py``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
from aetcd.rtypes import Get

from lorafleet.discovery.client import EtcdClient, connect_etcd
from lorafleet.discovery.errors import EtcdUnavailableError
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.launch.etcd_cluster import start_etcd_cluster
from tests.etcd_scenarios import ADAPTER, LORA_ENV, MODEL, Load, listed_models
from tests.faults import TcpProxy
from tests.invariants import CardChecker, Streams, keys_of
from tests.processes import ServiceProcess, start_frontend, start_worker
from tests.worker.adapters import make_adapter_dir

CUT_S = 15.0
"""How long the link stays cut: several lease TTLs (2 s here)."""
CLIENTS = 8
RUNS = 3


async def test_worker_cut_from_etcd_under_load_fails_nothing_and_republishes(
    tmp_path: Path, etcd_url: str, etcd: EtcdClient, nats_url: str, namespace: str
) -> None:
    for run in range(RUNS):
        figures = await _one_cut(tmp_path / f"run{run}", etcd_url, etcd, nats_url, namespace)
        print(f"run {run}: {figures}")
        assert figures["failed"] == 0 and figures["wrong"] == 0, figures
        assert figures["streams_broken"] == 0, figures
        assert figures["violations"] == 0, figures


async def _one_cut(
    tmp_path: Path, etcd_url: str, etcd: EtcdClient, nats_url: str, namespace: str
) -> dict[str, object]:
    proxy = await TcpProxy(int(etcd_url.rsplit(":", 1)[1])).start()
    where = {"nats_url": nats_url, "namespace": namespace}
    env = {**LORA_ENV, "DYN_LORA_PATH": str(tmp_path / "cache")}
    uri = f"file://{make_adapter_dir(tmp_path / 'adapters', ADAPTER)}"
    started: list[ServiceProcess] = []
    try:
        for etcd_of_worker in (proxy.url, etcd_url):  # A behind the proxy, B direct
            worker = await asyncio.to_thread(
                start_worker, tmp_path, etcd_url=etcd_of_worker, args=("--enable-lora",),
                env={**env, "ETCD_ENDPOINTS": etcd_of_worker}, **where,
            )  # fmt: skip
            started.append(worker)
            async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:
                body = {"lora_name": ADAPTER, "source": {"uri": uri}}
                assert (await client.post("/engine/update/load_lora", json=body)).is_success
        frontend = await asyncio.to_thread(start_frontend, tmp_path, etcd_url=etcd_url, **where)
        started.append(frontend)
        async with httpx.AsyncClient(base_url=frontend.url, timeout=10) as client:
            while await listed_models(client) != {MODEL, ADAPTER}:
                await asyncio.sleep(0.1)
        return await _cut_under_load(proxy, started[0], frontend, etcd, namespace)
    finally:
        for process in started:
            process.kill()
        await proxy.aclose()


async def _cut_under_load(
    proxy: TcpProxy, worker: ServiceProcess, frontend: ServiceProcess, etcd, namespace: str
) -> dict[str, object]:
    load = Load(frontend.url)
    streams = Streams(frontend.url)
    checker = CardChecker(etcd, namespace, [worker.url], {ADAPTER})
    async with httpx.AsyncClient(base_url=worker.url, timeout=10) as client:
        instance = (await client.get("/health")).json()["instance_id"]
        running = asyncio.gather(load.run(CLIENTS), streams.run(load.stop), checker.run(load.stop))
        proxy.cut()
        cut_at = time.monotonic()
        while (await client.get("/health")).status_code != 503:
            await asyncio.sleep(0.05)
        detect_s = time.monotonic() - cut_at
        await asyncio.sleep(max(0.0, CUT_S - detect_s))  # the partition's length, not a wait
        sent_during_cut = load.sent
        proxy.restore()
        restored_at = time.monotonic()
        while len(await keys_of(etcd, namespace, instance)) < 3:  # instance, base, adapter
            await asyncio.sleep(0.05)
        heal_s = time.monotonic() - restored_at
        await asyncio.sleep(1)  # load after the heal, then stop
        load.stop.set()
        await running
    violations = checker.violations
    return {
        "sent": load.sent, "sent_before_heal": sent_during_cut, "failed": load.failed,
        "wrong": load.wrong, "streams": streams.sent, "streams_broken": streams.broken,
        "violations": len(violations), "detect_s": round(detect_s, 2),
        "heal_s": round(heal_s, 2), "errors": (load.errors + violations)[:3],
    }  # fmt: skip


async def test_frontend_cut_from_etcd_serves_its_last_view_and_catches_up_fast(
    tmp_path: Path, etcd_url: str, nats_url: str, namespace: str
) -> None:
    """Three cuts; during each, 40 chats and a new worker with a new model behind the cut."""
    proxy = await TcpProxy(int(etcd_url.rsplit(":", 1)[1])).start()
    where = {"etcd_url": etcd_url, "nats_url": nats_url, "namespace": namespace}
    started = [await asyncio.to_thread(start_worker, tmp_path, model=MODEL, **where)]
    try:
        frontend = await asyncio.to_thread(
            start_frontend, tmp_path, **{**where, "etcd_url": proxy.url}
        )  # fmt: skip
        started.append(frontend)
        async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as client:
            while await listed_models(client) != {MODEL}:
                await asyncio.sleep(0.05)
            for run in range(RUNS):
                figures = await _frontend_cut(client, proxy, tmp_path, where, started, run)
                print(f"run {run}: {figures}")
                assert figures["failed"] == 0, figures
    finally:
        for process in started:
            process.kill()
        await proxy.aclose()


async def _frontend_cut(
    client: httpx.AsyncClient, proxy: TcpProxy, tmp_path: Path, where: dict[str, str],
    started: list[ServiceProcess], run: int,
) -> dict[str, object]:  # fmt: skip
    proxy.cut()
    cut_at = time.monotonic()
    while (await client.get("/health")).json()["status"] != "degraded":
        await asyncio.sleep(0.01)
    detect_s = time.monotonic() - cut_at
    name = f"new{run}"
    started.append(await asyncio.to_thread(start_worker, tmp_path, model=name, **where))
    failed = 0
    for _ in range(40):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        failed += (await client.post("/v1/chat/completions", json=body)).status_code != 200
    proxy.restore()
    restored_at = time.monotonic()
    while name not in await listed_models(client):
        await asyncio.sleep(0.01)
    heal_s = time.monotonic() - restored_at
    return {
        "sent": 40,
        "failed": failed,
        "detect_s": round(detect_s, 2),
        "heal_s": round(heal_s, 2),
    }


async def test_a_stalled_etcd_member_is_left_within_one_call_timeout(tmp_path: Path) -> None:
    """A follower, then the leader, SIGSTOPped while listed first; a lease of 10 s."""
    for run, which in enumerate(("follower", "leader") * RUNS):
        figures = await _stall(tmp_path / f"run{run}", which)
        print(f"run {run}, {which} stalled: {figures}")
        assert not figures["lease_lost"], figures


async def _stall(tmp_path: Path, which: str) -> dict[str, object]:
    cluster = await asyncio.to_thread(start_etcd_cluster, tmp_path)
    leader = await asyncio.to_thread(cluster.wait_for_leader)
    stalled = leader if which == "leader" else next(m for m in cluster.members if m is not leader)
    order = [stalled, *(m for m in cluster.members if m is not stalled)]
    etcd = await connect_etcd(",".join(m.url for m in order))
    try:
        keeper = await LeaseKeeper.grant(etcd, 10)
        await keeper.put("v1/stall/k", b"1")
        stalled.process.send_signal(signal.SIGSTOP)
        stalled_at = time.monotonic()
        _, failed = await _get_until_answered(etcd, b"v1/stall/k")
        answered_s = time.monotonic() - stalled_at
        value, failed_after = await _get_until_answered(etcd, b"v1/stall/k")
        lost = keeper.expired or value is None
        await keeper.aclose()
        return {
            "failed_calls": failed + failed_after,
            "answered_s": round(answered_s, 2),
            "lease_lost": lost,
        }
    finally:
        stalled.process.send_signal(signal.SIGCONT)
        await etcd.close()
        cluster.stop()


async def _get_until_answered(etcd: EtcdClient, key: bytes) -> tuple[Get | None, int]:
    """The key once a read answers, and how many reads failed before it.

    A read that fails while the client leaves the stalled member says nothing about the
    lease: the key is gone only when a member answers without it.
    """
    failed = 0
    while True:
        try:
            with etcd.errors("get"):
                return await etcd.get(key), failed
        except EtcdUnavailableError:
            failed += 1
