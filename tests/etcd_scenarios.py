"""etcd fault scenarios, written once; `make test-chaos` runs them with the issues' durations.

Each takes its durations as arguments. Everything is real: etcd (one member or a
cluster), NATS, a mocker worker with an adapter and a frontend, as processes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
import openai

from lorafleet.discovery.client import EtcdClient, connect_etcd
from lorafleet.discovery.errors import EtcdUnavailableError
from lorafleet.discovery.keys import card_prefix, instance_prefix
from lorafleet.launch.etcd_cluster import EtcdCluster, start_etcd_cluster
from lorafleet.launch.local_servers import LocalServer
from tests.processes import ServiceProcess, start_frontend, start_worker
from tests.worker.adapters import make_adapter_dir

MODEL: Final = "demo"
ADAPTER: Final = "pirate"
POLL_INTERVAL_S: Final = 0.1
LORA_ENV: Final = {"DYN_LORA_ENABLED": "true"}


@dataclass
class Fleet:
    """A mocker worker serving ``MODEL`` with ``ADAPTER`` loaded, and a frontend."""

    worker: ServiceProcess
    frontend: ServiceProcess

    def stop(self) -> None:
        """Stop both processes."""
        for process in (self.frontend, self.worker):
            process.kill()


async def start_fleet(
    tmp_path: Path, *, etcd_endpoints: str, nats_url: str, namespace: str,
    env: dict[str, str] | None = None, lease_ttl_s: int = 2,
) -> Fleet:  # fmt: skip
    """Start the worker, load the adapter, start the frontend and wait until it lists both."""
    common = {"ETCD_ENDPOINTS": etcd_endpoints, **(env or {})}
    worker = await asyncio.to_thread(
        start_worker, tmp_path, etcd_url=etcd_endpoints, nats_url=nats_url,
        namespace=namespace, args=("--enable-lora",),
        env={**common, **LORA_ENV, "DYN_LEASE_TTL": str(lease_ttl_s),
             "DYN_LORA_PATH": str(tmp_path / "cache")},
    )  # fmt: skip
    uri = f"file://{make_adapter_dir(tmp_path / 'adapters', ADAPTER)}"
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:
        body = {"lora_name": ADAPTER, "source": {"uri": uri}}
        response = await client.post("/engine/update/load_lora", json=body)
        assert response.status_code == 200, response.text
    frontend = await asyncio.to_thread(
        start_frontend, tmp_path, etcd_url=etcd_endpoints, nats_url=nats_url,
        namespace=namespace, env=common,
    )  # fmt: skip
    fleet = Fleet(worker, frontend)
    async with httpx.AsyncClient(base_url=frontend.url, timeout=10) as client, asyncio.timeout(30):
        while await listed_models(client) != {MODEL, ADAPTER}:
            await asyncio.sleep(POLL_INTERVAL_S)
    return fleet


async def listed_models(client: httpx.AsyncClient) -> set[str]:
    """The model ids the frontend's ``/v1/models`` lists."""
    response = await client.get("/v1/models")
    assert response.status_code == 200, response.text
    return {model["id"] for model in response.json()["data"]}


async def models_never_missed(frontend_url: str, poll_s: float) -> int:
    """Poll ``/v1/models`` every 100 ms for ``poll_s``; assert every poll lists both models."""
    polls = 0
    deadline = time.monotonic() + poll_s
    async with httpx.AsyncClient(base_url=frontend_url, timeout=5) as client:
        while time.monotonic() < deadline:
            models = await listed_models(client)
            assert models == {MODEL, ADAPTER}, f"poll {polls}: /v1/models listed {models}"
            polls += 1
            await asyncio.sleep(POLL_INTERVAL_S)
    return polls


async def etcd_outage(
    tmp_path: Path, etcd: LocalServer, nats_url: str, namespace: str, *,
    outage_s: float, poll_s: float, lease_ttl_s: int = 2,
) -> None:  # fmt: skip
    """SIGKILL etcd for ``outage_s``, restart it on the same data; no model may go missing."""
    fleet = await start_fleet(
        tmp_path, etcd_endpoints=etcd.url, nats_url=nats_url, namespace=namespace,
        lease_ttl_s=lease_ttl_s,
    )  # fmt: skip
    try:
        etcd.stop(kill=True)
        await asyncio.sleep(outage_s)  # the outage itself, not a wait for an event
        await asyncio.to_thread(etcd.start_again)
        polls = await models_never_missed(fleet.frontend.url, poll_s)
        assert polls >= poll_s / (POLL_INTERVAL_S * 4)  # the polling really ran
    finally:
        fleet.stop()


@dataclass
class Load:
    """Closed-loop non-streaming chats through the frontend, counted until ``stop``.

    Client ``i`` asks for ``models[i % len(models)]``.
    """

    frontend_url: str
    models: tuple[str, ...] = (MODEL, ADAPTER)
    sent: int = 0
    failed: int = 0
    wrong: int = 0
    """Answers that came back for another model than the one asked for: the field says
    so, or the text does (the mocker's text names the model that made it)."""
    errors: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, clients: int) -> None:
        """Run ``clients`` tasks, each sending its next chat when the last one answered."""
        client = openai.AsyncOpenAI(
            base_url=f"{self.frontend_url}/v1", api_key="unused", max_retries=0, timeout=30
        )
        async with client:
            await asyncio.gather(*(self._loop(client, i) for i in range(clients)))

    async def _loop(self, client: openai.AsyncOpenAI, index: int) -> None:
        model = self.models[index % len(self.models)]
        while not self.stop.is_set():
            self.sent += 1
            try:
                answer = await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
            except openai.OpenAIError as exc:
                self.failed += 1
                self.errors.append(f"{model}: {exc}")
                continue
            text = answer.choices[0].message.content or ""
            if answer.model != model or not names_only(text, model):
                self.wrong += 1
                self.errors.append(f"{model}: answered as {answer.model}: {text[:60]!r}")


def names_only(text: str, model: str) -> bool:
    """Whether every token of a mocker's ``text`` was made by ``model`` (``pirate:0 ...``)."""
    return all(token.rsplit(":", 1)[0] == model for token in text.split())


async def records(etcd: EtcdClient, namespace: str) -> dict[str, int]:
    """Every instance record and card of ``namespace``, with the lease it is bound to."""
    found = {}
    for prefix in (instance_prefix(namespace), card_prefix(namespace)):
        for kv in await etcd.get_prefix(prefix.encode()):
            found[kv.key.decode()] = kv.lease
    return found


async def leader_kills_under_load(
    tmp_path: Path, nats_url: str, namespace: str, *,
    kills: int, load_s: float, clients: int = 8, lease_ttl_s: int = 2,
) -> Load:  # fmt: skip
    """Kill the etcd leader ``kills`` times under chat load; no record or lease may be lost.

    The leader is listed first in ``ETCD_ENDPOINTS``, so every process is connected to
    the member that dies and must fail over. Each killed member is started again before
    the next kill. Returns the load's counts; the caller bounds the failures.
    """
    cluster = await asyncio.to_thread(start_etcd_cluster, tmp_path / "etcd")
    leader = await asyncio.to_thread(cluster.wait_for_leader)
    endpoints = ",".join([leader.url, *(m.url for m in cluster.members if m is not leader)])
    fleet = await start_fleet(
        tmp_path, etcd_endpoints=endpoints, nats_url=nats_url, namespace=namespace,
        lease_ttl_s=lease_ttl_s,
    )  # fmt: skip
    etcd = await connect_etcd(cluster.endpoints)
    load = Load(fleet.frontend.url)
    try:
        before = await records(etcd, namespace)
        running = asyncio.create_task(load.run(clients))
        for _ in range(kills):
            await _kill_leader(cluster, load_s)
        load.stop.set()
        await running
        async with asyncio.timeout(10):  # an etcd call may meet the last election
            while (after := await _records_quietly(etcd, namespace)) is None:
                await asyncio.sleep(POLL_INTERVAL_S)
        assert after == before, "a record or its lease changed across the leader kills"
        assert "lease re-granted" not in fleet.worker.log_path.read_text()  # never expired
        assert await listed_models_of(fleet.frontend.url) == {MODEL, ADAPTER}
    finally:
        load.stop.set()
        await etcd.close()
        fleet.stop()
        cluster.stop()
    return load


async def _kill_leader(cluster: EtcdCluster, load_s: float) -> None:
    await asyncio.sleep(load_s / 2)  # load before the kill: the fault's timing, not a wait
    leader = await asyncio.to_thread(cluster.wait_for_leader)
    leader.stop(kill=True)
    await asyncio.to_thread(cluster.wait_for_leader)
    await asyncio.sleep(load_s / 2)  # load after the new leader was elected
    await asyncio.to_thread(leader.start_again)


async def _records_quietly(etcd: EtcdClient, namespace: str) -> dict[str, int] | None:
    try:
        with etcd.errors("list records"):
            return await records(etcd, namespace)
    except EtcdUnavailableError:
        return None


async def listed_models_of(frontend_url: str) -> set[str]:
    """The model ids a frontend lists now."""
    async with httpx.AsyncClient(base_url=frontend_url, timeout=10) as client:
        return await listed_models(client)
