"""Prefix-aware routing end to end: real etcd, NATS and frontends, stand-in workers whose
stand-in relay (``tests/frontend/kv_stand_in.py``) caches what they serve and publishes it.

Where a prefix landed is read from the workers' own hit counters and request logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.keys import kv_events_subject
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from lorafleet.launch.cli import main as lorafleet
from lorafleet.launch.local_servers import start_nats
from lorafleet.proto.inference import ChatMessage, GenerateRequest, encode_msg
from lorafleet.proto.kv_events import BlocksStored, KvEventBatch
from tests.frontend.conftest import FAST_DISPATCH, RunningFrontend, run_frontend, wait_for_models
from tests.frontend.kv_stand_in import BLOCK_SIZE
from tests.frontend.stand_in import StandInWorker

SYSTEM = " ".join(f"rule{n}" for n in range(200))
OTHER = " ".join(f"note{n}" for n in range(200))
GAP = " ".join(f"gap{n}" for n in range(200))
PREFIX_BLOCKS = 200 // BLOCK_SIZE
TIMEOUT_S = 20


@pytest.fixture
def prefix_config(etcd_url: str, nats_url: str, namespace: str) -> FrontendConfig:
    etcd = EtcdSettings.from_endpoints(etcd_url)
    return FrontendConfig(namespace=namespace, etcd=etcd, nats_server=nats_url,
                          dispatch=FAST_DISPATCH, router="prefix")  # fmt: skip


@pytest.fixture
async def kv_workers(
    nats_url: str, etcd: EtcdClient, namespace: str
) -> AsyncIterator[Callable[..., asyncio.Future[StandInWorker]]]:
    """Starts stand-ins that publish KV events; all are stopped afterwards."""
    started: list[StandInWorker] = []

    async def start(**options: object) -> StandInWorker:
        worker = StandInWorker(nats_url, etcd, namespace, "demo", kv=True, **options)  # type: ignore[arg-type]
        started.append(await worker.start())
        return worker

    yield start  # type: ignore[misc]
    for worker in started:
        with contextlib.suppress(Exception):
            await worker.stop()


async def _metric(frontend: RunningFrontend, name: str, **labels: str) -> float:
    text = (await frontend.http.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


async def _until(frontend: RunningFrontend, name: str, ok: Callable[[float], bool],
                 **labels: str) -> None:  # fmt: skip
    """Wait until the frontend's metric ``name`` satisfies ``ok`` (an event, not a time)."""
    async with asyncio.timeout(TIMEOUT_S):
        while not ok(await _metric(frontend, name, **labels)):
            await asyncio.sleep(0.02)


async def _following(frontend: RunningFrontend, count: int) -> None:
    """Wait until the frontend follows the events of ``count`` instances."""
    await _until(frontend, "lorafleet_kv_followed_instances", lambda v: v == count)


def _client(frontend: RunningFrontend) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)


async def _ask(client: openai.AsyncOpenAI, question: str, *, system: str = SYSTEM,
               model: str = "demo", max_tokens: int = 4, **extra: object) -> None:  # fmt: skip
    await client.chat.completions.create(
        model=model, max_tokens=max_tokens, extra_body=extra or None,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
    )  # fmt: skip


def _warm(model: str = "demo", system: str = SYSTEM, salt: str = "") -> GenerateRequest:
    """A request a worker served before (its blocks now cached there and published)."""
    messages = [ChatMessage(role="system", content=system), ChatMessage(role="user", content="hi")]
    return GenerateRequest(request_id="warm", model=model, messages=messages, cache_salt=salt)


async def test_shared_prefixes_land_on_the_instance_that_holds_them(
    prefix_config: FrontendConfig, kv_workers: Callable[..., asyncio.Future[StandInWorker]]
) -> None:
    workers = [await kv_workers() for _ in range(3)]
    holder = workers[1]
    async with run_frontend(prefix_config) as frontend:
        await wait_for_models(frontend, {"demo"})
        await _following(frontend, 3)
        await holder.kv.serve(_warm())
        await _until(frontend, "lorafleet_kv_index_blocks", lambda v: v >= PREFIX_BLOCKS)
        client = _client(frontend)
        for n in range(6):
            await _ask(client, f"question {n}")
        assert [len(w.generated) for w in workers] == [0, 6, 0]
        assert holder.kv.hits == 6 * PREFIX_BLOCKS * BLOCK_SIZE  # the worker's own count
        assert await _metric(frontend, "lorafleet_router_decisions_total", reason="overlap") == 6


async def test_adapters_and_versions_never_share_blocks(
    prefix_config: FrontendConfig, kv_workers: Callable[..., asyncio.Future[StandInWorker]]
) -> None:
    digests = {"tone": "sha256:t1", "mood": "sha256:m1"}
    a, b = [await kv_workers(adapters=("tone", "mood"), digests=digests) for _ in range(2)]
    async with run_frontend(prefix_config) as frontend:
        await wait_for_models(frontend, {"demo", "tone", "mood"})
        await _following(frontend, 2)
        await a.kv.serve(_warm("tone"))
        await b.kv.serve(_warm("mood"))
        await _until(frontend, "lorafleet_kv_index_blocks", lambda v: v >= 2 * PREFIX_BLOCKS)
        client = _client(frontend)
        for n in range(3):
            await _ask(client, f"tone {n}", model="tone")
            await _ask(client, f"mood {n}", model="mood")
        assert [r.model for r in a.generated] == ["tone"] * 3
        assert [r.model for r in b.generated] == ["mood"] * 3
        await a.swap("tone", "sha256:t2")  # a's tone blocks are of a version gone
        await _until(frontend, "lorafleet_kv_index_blocks", lambda v: v == PREFIX_BLOCKS)
        await b.kv.serve(_warm("demo"))  # the base model's blocks are not the adapters'
        await _until(frontend, "lorafleet_kv_index_blocks", lambda v: v == 2 * PREFIX_BLOCKS)
        hits = a.kv.hits
        await _ask(client, "after the swap", model="tone")
        assert a.kv.hits == hits  # the new version computed its prefix anew


async def test_a_saturated_holder_sheds_the_prefix_to_another_instance(
    prefix_config: FrontendConfig, kv_workers: Callable[..., asyncio.Future[StandInWorker]]
) -> None:
    a, b = [await kv_workers(token_delay_s=0.05) for _ in range(2)]
    config = dataclasses.replace(prefix_config, router_load_weight=4.0)
    async with run_frontend(config) as frontend:
        await wait_for_models(frontend, {"demo"})
        await _following(frontend, 2)
        await a.kv.serve(_warm())
        await _until(frontend, "lorafleet_kv_index_blocks", lambda v: v >= PREFIX_BLOCKS)
        client = _client(frontend)
        await _ask(client, "alone")  # the holder takes it while idle
        assert (len(a.generated), len(b.generated)) == (1, 0)
        await asyncio.gather(*(_ask(client, f"busy {n}", max_tokens=40) for n in range(6)))
        assert len(a.generated) > 1 and len(b.generated) > 0
        assert await _metric(frontend, "lorafleet_router_decisions_total", reason="load") >= 1


async def test_a_frontend_started_late_or_behind_catches_up_by_snapshot(
    prefix_config: FrontendConfig, kv_workers: Callable[..., asyncio.Future[StandInWorker]]
) -> None:
    a, b = [await kv_workers() for _ in range(2)]
    await b.kv.serve(_warm())  # before any frontend listened: only a snapshot tells it
    async with run_frontend(prefix_config) as frontend:
        await wait_for_models(frontend, {"demo"})
        client = _client(frontend)
        await asyncio.gather(*(_ask(client, f"early {n}", system=OTHER) for n in range(4)))
        await _following(frontend, 2)
        for n in range(3):
            await _ask(client, f"late {n}")
        assert sum("rule0" in r.messages[0].content for r in b.generated) == 3
        snapshots = await _metric(frontend, "lorafleet_kv_snapshots_total", outcome="ok")
        a.kv.lose_next = True
        await a.kv.serve(_warm(system=GAP))  # its batch is lost: a gap
        await a.kv.serve(_warm(system="unrelated " * 40))  # the next one shows the gap
        await _until(frontend, "lorafleet_kv_snapshots_total", lambda v: v > snapshots,
                     outcome="ok")  # fmt: skip
        await _following(frontend, 2)
        before = len(a.generated)
        await _ask(client, "after the gap", system=GAP)
        assert len(a.generated) == before + 1


async def test_an_instance_that_leaves_takes_its_blocks_out_of_the_index(
    prefix_config: FrontendConfig, kv_workers: Callable[..., asyncio.Future[StandInWorker]]
) -> None:
    a, b = [await kv_workers() for _ in range(2)]
    async with run_frontend(prefix_config) as frontend:
        await wait_for_models(frontend, {"demo"})
        await _following(frontend, 2)
        await a.kv.serve(_warm())
        await _until(frontend, "lorafleet_kv_index_blocks", lambda v: v >= PREFIX_BLOCKS)
        await a.stop()
        await _until(frontend, "lorafleet_kv_index_blocks", lambda v: v == 0)
        await _ask(_client(frontend), "still answered")
        assert len(b.generated) == 1


async def test_bad_events_are_dropped_and_counted_and_good_ones_still_apply(
    prefix_config: FrontendConfig,
    kv_workers: Callable[..., asyncio.Future[StandInWorker]],
    namespace: str,
) -> None:
    a = await kv_workers()
    async with run_frontend(prefix_config) as frontend:
        await wait_for_models(frontend, {"demo"})
        await _following(frontend, 1)
        subject = kv_events_subject(namespace)
        stranger = KvEventBatch(instance_id=12345, seq=1, sent_at=0.0,
                                events=[BlocksStored(version="demo", hashes=[1])])  # fmt: skip
        await a.nc.publish(subject, b"\x93not a batch")
        await a.nc.publish(subject, encode_msg(stranger))
        await a.kv.publish([BlocksStored(version="ghost@sha256:0", hashes=[2])])
        await a.kv.serve(_warm())
        await _until(frontend, "lorafleet_kv_index_blocks", lambda v: v == PREFIX_BLOCKS)
        dropped = "lorafleet_kv_events_dropped_total"
        assert await _metric(frontend, dropped, reason="malformed") == 1
        assert await _metric(frontend, dropped, reason="unknown_instance") == 1
        assert await _metric(frontend, dropped, reason="unknown_version") == 1


async def test_cache_salt_isolates_in_the_index_and_a_tenant_may_salt_with_its_name(
    prefix_config: FrontendConfig,
    kv_workers: Callable[..., asyncio.Future[StandInWorker]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = [await kv_workers() for _ in range(2)]
    admin = {"Authorization": "Bearer adm1n"}
    async with run_frontend(dataclasses.replace(prefix_config, admin_token="adm1n")) as frontend:
        await wait_for_models(frontend, {"demo"})
        await _following(frontend, 2)
        client = _client(frontend)
        with pytest.raises(openai.BadRequestError) as refused:
            await _ask(client, "salted?", cache_salt=5)
        assert refused.value.body["param"] == "cache_salt"  # type: ignore[index]
        await a.kv.serve(_warm(salt="acme"))
        await b.kv.serve(_warm())
        await _until(frontend, "lorafleet_kv_index_blocks", lambda v: v == 2 * PREFIX_BLOCKS)
        for n in range(2):
            await _ask(client, f"salted {n}", cache_salt="acme")
            await _ask(client, f"plain {n}")
        assert [r.cache_salt for r in a.generated] == ["acme", "acme"]
        assert [r.cache_salt for r in b.generated] == ["", ""]
        monkeypatch.setenv("DYN_ADMIN_TOKEN", "adm1n")
        where = ("--frontend", frontend.url)
        assert (
            await asyncio.to_thread(lorafleet, ["tenants", "set", "acme", "--salt-cache", *where])
            == 0
        )
        key = await frontend.http.post("/v1/keys", json={"tenant": "acme"}, headers=admin)
        tenant_client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1",
                                           api_key=key.json()["key"], max_retries=0)  # fmt: skip
        async with asyncio.timeout(TIMEOUT_S):
            while True:  # until this frontend's watch has the new key
                with contextlib.suppress(openai.AuthenticationError):
                    await _ask(tenant_client, "as a tenant", cache_salt="eu")
                    break
                await asyncio.sleep(0.02)
        served = [r for r in a.generated + b.generated if r.messages[1].content == "as a tenant"]
        assert [r.cache_salt for r in served] == ["acme\0eu"]


async def check_index_rebuilt_after_nats_outage(
    tmp_path: Path, etcd: EtcdClient, etcd_url: str, namespace: str, outage_s: float
) -> None:
    """NATS down ``outage_s`` while a worker caches a prefix nobody hears of; while the
    frontend catches up (the snapshots held back) every request succeeds, and once the
    snapshots came the prefix goes to the worker that cached it during the outage."""
    server = start_nats(tmp_path / "nats-own")
    etcd_settings = EtcdSettings.from_endpoints(etcd_url)
    config = FrontendConfig(namespace=namespace, etcd=etcd_settings, nats_server=server.url,
                            dispatch=FAST_DISPATCH, router="prefix")  # fmt: skip
    a, b = [StandInWorker(server.url, etcd, namespace, "demo", kv=True) for _ in range(2)]
    try:
        for worker in (a, b):
            await worker.start()
        async with run_frontend(config) as frontend:
            await wait_for_models(frontend, {"demo"})
            await _following(frontend, 2)
            await a.kv.serve(_warm(system=OTHER))  # so a's next batch is not its first
            await _until(frontend, "lorafleet_kv_index_blocks", lambda v: v == PREFIX_BLOCKS)
            await asyncio.to_thread(server.stop)
            await _following(frontend, 0)  # events may be lost now: trust none
            b.kv.lose_next = True
            await b.kv.serve(_warm())  # cached while NATS was away: no event reaches anyone
            await asyncio.sleep(outage_s)  # the outage itself, not a wait for an event
            released = asyncio.Event()
            asked = [a.kv.snapshots_asked, b.kv.snapshots_asked]
            a.kv.snapshots_held = b.kv.snapshots_held = released
            await asyncio.to_thread(server.start_again)
            async with asyncio.timeout(TIMEOUT_S):  # until the frontend asks both again
                while a.kv.snapshots_asked == asked[0] or b.kv.snapshots_asked == asked[1]:
                    await asyncio.sleep(0.02)
            # Served without the index (another prompt, so that only b holds SYSTEM's).
            catching_up = [_ask(_client(frontend), f"meanwhile {n}", system=OTHER)
                           for n in range(4)]  # fmt: skip
            await asyncio.gather(*catching_up)  # none fails
            assert await _metric(frontend, "lorafleet_kv_followed_instances") == 0
            released.set()
            await _following(frontend, 2)  # every instance's snapshot came and was applied
            served_before = (len(a.generated), len(b.generated))
            for n in range(3):
                await _ask(_client(frontend), f"after the outage {n}")
            assert (len(a.generated), len(b.generated)) == (
                served_before[0],
                served_before[1] + 3,
            )
    finally:
        for worker in (a, b):
            with contextlib.suppress(Exception):
                await worker.stop()
        server.stop()


async def test_after_a_nats_outage_the_index_is_rebuilt_from_snapshots(
    tmp_path: Path, etcd: EtcdClient, etcd_url: str, namespace: str
) -> None:
    await check_index_rebuilt_after_nats_outage(tmp_path, etcd, etcd_url, namespace, 1.0)
