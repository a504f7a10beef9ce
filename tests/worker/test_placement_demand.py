"""Placement by demand with real workers and a real frontend: copies follow the requests,
eviction follows fleet demand, and a load that fails backs off in the load record."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import openai
import pytest

from lorafleet.fleet.placement import IN_USE_RPS
from lorafleet.proto.fleet_load import InstanceLoad
from tests.processes import ServiceProcess, start_frontend
from tests.worker.adapters import make_adapter_dir
from tests.worker.fleet import (
    assert_invariant_everywhere,
    holders,
    instance_id,
    load_records,
    put_spec,
    wait_for_holders,
    wait_for_records,
)

FAST_COPIES = ("--lora-copy-rps", "2", "--lora-copy-cooldown-s", "1",
               "--lora-demand-half-life-s", "1")  # fmt: skip
"""A copy per 2 req/s, prefetched at 1.4 req/s; gone 1 s after demand fell below 1 req/s."""


@pytest.fixture
def fleet_worker(worker_factory, tmp_path: Path):
    def start(*args: str, max_loras: int = 4):
        env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
        return worker_factory("--enable-lora", "--max-loras", str(max_loras), *args, env=env)

    return start


@pytest.fixture
async def client(
    tmp_path: Path, etcd_url, nats_url, namespace
) -> AsyncIterator[openai.AsyncOpenAI]:
    frontend = await asyncio.to_thread(
        start_frontend, tmp_path, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace
    )
    try:
        async with openai.AsyncOpenAI(
            base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0
        ) as client:
            yield client
    finally:
        frontend.kill()


async def _ask(client: openai.AsyncOpenAI, model: str) -> None:
    await client.completions.create(model=model, prompt="ahoy", max_tokens=2)


async def _ask_once_desired(client: openai.AsyncOpenAI, model: str) -> None:
    """Ask for ``model`` as soon as the frontend's watch shows its desired state (404 before)."""
    async with asyncio.timeout(10):
        while True:
            try:
                return await _ask(client, model)
            except openai.NotFoundError:
                await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _traffic(client: openai.AsyncOpenAI, model: str) -> AsyncIterator[None]:
    """Requests for ``model`` one after the other (tens per second) while the block runs."""

    async def loop() -> None:
        while True:
            await _ask(client, model)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_rising_demand_adds_a_copy_that_goes_after_the_cooldown(
    fleet_worker, client, etcd, namespace, tmp_path: Path
):
    workers = [await asyncio.to_thread(fleet_worker, *FAST_COPIES) for _ in range(2)]
    await put_spec(etcd, namespace, tmp_path / "adapters", "hot", min_replicas=1, max_replicas=2)
    copies = lambda n: lambda where, _: len(where.get("hot", ())) == n  # noqa: E731
    await wait_for_holders(etcd, namespace, copies(1), timeout_s=20)

    async with _traffic(client, "hot"):
        await wait_for_holders(etcd, namespace, copies(2), timeout_s=30)
    await assert_invariant_everywhere(workers, etcd, namespace)

    await wait_for_holders(etcd, namespace, copies(1), timeout_s=30)  # demand decays, cool-down
    await assert_invariant_everywhere(workers, etcd, namespace)


async def test_an_on_demand_adapter_keeps_one_warm_copy_when_its_demand_falls(
    fleet_worker, client, etcd, namespace, tmp_path: Path
):
    """``min_replicas: 0``: demand adds placed copies from two on; when it falls, the plan
    places none, and one holder keeps its copy (on demand) instead of all unloading."""
    workers = [await asyncio.to_thread(fleet_worker, *FAST_COPIES) for _ in range(2)]
    await put_spec(etcd, namespace, tmp_path / "adapters", "hot", min_replicas=0, max_replicas=2)
    copies = lambda n: lambda where, _: len(where.get("hot", ())) == n  # noqa: E731
    await _ask_once_desired(client, "hot")  # the first request loads it on demand

    async with _traffic(client, "hot"):
        await wait_for_holders(etcd, namespace, copies(2), timeout_s=30)
    await wait_for_holders(etcd, namespace, copies(1), timeout_s=30)  # decay, cool-down
    # until no record shows demand: nothing changes after
    no_demand = lambda records: not any("hot" in r.demand for r in records.values())  # noqa: E731
    await wait_for_records(etcd, namespace, no_demand, timeout_s=30)
    where, _ = await holders(etcd, namespace)
    assert len(where.get("hot", ())) == 1
    await assert_invariant_everywhere(workers, etcd, namespace)


async def test_eviction_takes_the_adapter_the_fleet_asks_least_for(
    fleet_worker, client, etcd, namespace, tmp_path: Path
):
    worker = await asyncio.to_thread(fleet_worker, "--lora-in-use-s", "600", max_loras=2)
    me = await instance_id(worker)
    for name in ("busy", "quiet", "third", "fourth"):  # on demand only: nothing is placed
        await put_spec(etcd, namespace, tmp_path / "adapters", name, replicas=0)
    for _ in range(30):  # about 0.7 req/s: in use for a minute at a 30 s half-life
        await _ask(client, "busy")
    await _ask(client, "quiet")  # used last: plain LRU would evict "busy"
    await _wait_for_demand(etcd, namespace, me, "busy")
    record = await _wait_for_record(etcd, namespace, me, lambda r: r.evicts == "quiet")
    assert not record.evicts_placed  # frontends read it to pick where a cold load goes

    await _ask(client, "third")
    where = await wait_for_holders(etcd, namespace, lambda w, _: "third" in w, timeout_s=10)
    assert set(where) == {"busy", "third"}
    await assert_invariant_everywhere([worker], etcd, namespace)

    for _ in range(30):  # about 0.7 req/s: in use for a minute at a 30 s half-life
        await _ask(client, "third")
    await _wait_for_demand(etcd, namespace, me, "third")
    with pytest.raises(openai.APIStatusError) as refused:  # both are the last warm copy in use
        await _ask(client, "fourth")
    assert "capacity" in str(refused.value) or refused.value.status_code == 429
    where, _ = await holders(etcd, namespace)
    assert set(where) == {"busy", "third"}
    await _wait_for_record(etcd, namespace, me, lambda r: r.evicts == "")  # nothing may go
    await assert_invariant_everywhere([worker], etcd, namespace)


async def test_demand_without_a_recent_request_does_not_keep_a_slot(
    fleet_worker, client, etcd, namespace, tmp_path: Path
):
    """ "In use" needs a request within ``--lora-in-use-s`` as well as demand: with the
    window closed, a cold load evicts the adapter the fleet asks least for instead of
    answering 429, however much demand both loaded adapters had."""
    worker = await asyncio.to_thread(fleet_worker, "--lora-in-use-s", "0", max_loras=2)
    me = await instance_id(worker)
    for name in ("older", "newer", "cold"):  # on demand only: nothing is placed
        await put_spec(etcd, namespace, tmp_path / "adapters", name, replicas=0)
    for name, requests in (("older", 30), ("newer", 40)):  # both well above 0.1 req/s
        await _ask_once_desired(client, name)
        for _ in range(requests - 1):
            await _ask(client, name)
        await _wait_for_demand(etcd, namespace, me, name)

    await _ask(client, "cold")
    where, _ = await holders(etcd, namespace)
    assert set(where) == {"newer", "cold"}  # "older" had the least demand
    await assert_invariant_everywhere([worker], etcd, namespace)


async def _wait_for_record(
    etcd, namespace: str, instance: int, holds: Callable[[InstanceLoad], bool]
) -> InstanceLoad:
    """``instance``'s load record once ``holds`` is true of it (it is rewritten on changes)."""
    records = await wait_for_records(
        etcd, namespace, lambda records: instance in records and holds(records[instance])
    )
    return records[instance]


async def _wait_for_demand(etcd, namespace: str, instance: int, name: str) -> None:
    """Until ``instance``'s load record shows ``name`` in use (at least ``IN_USE_RPS``)."""
    await _wait_for_record(
        etcd, namespace, instance, lambda record: record.demand.get(name, 0.0) >= IN_USE_RPS
    )


async def test_a_failing_load_backs_off_shows_in_the_load_record_and_recovers(
    fleet_worker, etcd, namespace, tmp_path: Path
):
    worker: ServiceProcess = await asyncio.to_thread(fleet_worker)
    me = await instance_id(worker)
    missing = tmp_path / "later"
    await put_spec(etcd, namespace, missing, "late", replicas=1)
    (missing / "late" / "adapter_config.json").unlink()  # not loadable until written again

    async with asyncio.timeout(20):
        while (failure := (await load_records(etcd, namespace))[me].failed.get("late")) is None or (
            failure.attempts < 2
        ):
            await asyncio.sleep(0.1)
    assert failure.code and "late" in failure.message
    assert failure.retry_at > failure.at
    assert worker.log_text().count("placement could not load adapter") == 1  # once per state change

    make_adapter_dir(missing, "late")
    await wait_for_holders(etcd, namespace, lambda w, _: "late" in w, timeout_s=60)
    async with asyncio.timeout(5):
        while (await load_records(etcd, namespace))[me].failed:
            await asyncio.sleep(0.1)
    await assert_invariant_everywhere([worker], etcd, namespace)


async def test_the_load_record_lives_with_the_worker(fleet_worker, etcd, namespace):
    worker: ServiceProcess = await asyncio.to_thread(fleet_worker, max_loras=3)
    me = await instance_id(worker)
    async with asyncio.timeout(10):
        while me not in (records := await load_records(etcd, namespace)):
            await asyncio.sleep(0.1)
    assert (records[me].base_model, records[me].max_loras, records[me].free_slots) == ("demo", 3, 3)

    await asyncio.to_thread(worker.terminate)
    assert me not in await load_records(etcd, namespace)


async def test_a_placement_load_that_meets_a_full_worker_is_no_failure_of_the_adapter(
    fleet_worker, etcd, namespace, tmp_path: Path
):
    """``capacity`` says the worker is full, not that the adapter is broken: the load record
    shows no failure (so no frontend answers 424 for it) and the next pass tries again."""
    worker = await asyncio.to_thread(fleet_worker, "--placement-policy", "rendezvous", max_loras=1)
    me = await instance_id(worker)
    await put_spec(etcd, namespace, tmp_path / "adapters", "first", replicas=1, pinned=True)
    await wait_for_holders(etcd, namespace, lambda where, _: "first" in where, timeout_s=20)
    await put_spec(etcd, namespace, tmp_path / "adapters", "second", replicas=1, pinned=True)

    async with asyncio.timeout(60):  # rendezvous places by hash alone: "second" meets no slot
        while _load_outcomes(worker).get("capacity", 0.0) < 3:  # tried again and again
            assert "second" not in (await load_records(etcd, namespace))[me].failed
            await asyncio.sleep(0.1)
    where, _ = await holders(etcd, namespace)
    assert where == {"first": {me}}
    await assert_invariant_everywhere([worker], etcd, namespace)


def _load_outcomes(worker: ServiceProcess) -> dict[str, float]:
    """The worker's load operations by outcome (``ok``, ``capacity``, ...)."""
    text = httpx.get(f"{worker.url}/metrics").text
    pattern = r'adapter_operations_total\{operation="load",outcome="([^"]*)"\} (\S+)'
    return {outcome: float(value) for outcome, value in re.findall(pattern, text)}
