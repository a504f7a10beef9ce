"""Latency targets with real workers and a real frontend: an adapter that misses its TTFT
(or inter-token) target while demand alone keeps one copy gets a second one,
``/v1/adapters`` says why, and the copy goes once the traffic is gone.

The workers run the mocker engine (no GPU here) at 0.1 s per token, so every token comes
at least 100 ms after the last: a 20 ms target is missed by every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest

from lorafleet.discovery.keys import slo_copies_prefix, slo_reports_prefix
from lorafleet.launch.fleet_status import print_fleet
from lorafleet.proto.slo import decode_slo_copies
from tests.processes import ServiceProcess, start_frontend
from tests.worker.adapters import make_adapter_dir
from tests.worker.fleet import assert_invariant_everywhere, wait_for_holders

SLOW_FIRST_TOKEN = ("--mocker-time-per-token-s", "0.1")
DEMAND_KEEPS_ONE = ("--lora-copy-rps", "100", "--lora-demand-half-life-s", "1",
                    "--lora-copy-cooldown-s", "1")  # fmt: skip
"""Demand adds a copy only past 70 req/s: the test's few requests per second keep one.
Demand decays fast, so the extra copy goes soon after the traffic."""


@pytest.fixture
def frontend_factory(tmp_path: Path, etcd_url, nats_url, namespace):
    """Start frontends that judge 1 s windows from two requests on; all stopped at the end."""
    started: list[ServiceProcess] = []

    def start() -> ServiceProcess:
        judged_fast = ("--slo-window-s", "1", "--slo-min-requests", "2")
        service = start_frontend(tmp_path, etcd_url=etcd_url, nats_url=nats_url,
                                 namespace=namespace, args=judged_fast)  # fmt: skip
        started.append(service)
        return service

    yield start
    for service in started:
        service.kill()


@pytest.fixture
async def frontend(frontend_factory) -> ServiceProcess:
    return await asyncio.to_thread(frontend_factory)


@pytest.fixture
async def fleet_workers(worker_factory, tmp_path: Path) -> list[ServiceProcess]:
    """Two mocker workers, slow per token, whose demand alone keeps one copy."""
    env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
    args = ("--enable-lora", "--max-loras", "4", *SLOW_FIRST_TOKEN, *DEMAND_KEEPS_ONE)
    return [await asyncio.to_thread(worker_factory, *args, env=env) for _ in range(2)]


def _hot(tmp_path: Path, slo: dict[str, float]) -> dict[str, object]:
    uri = f"file://{make_adapter_dir(tmp_path / 'adapters', 'hot')}"
    return {"name": "hot", "base_model": "demo", "source": {"uri": uri},
            "min_replicas": 1, "max_replicas": 2, "slo": slo}  # fmt: skip


def _copies(n: int):
    return lambda where, _bases: len(where.get("hot", ())) == n


@contextlib.asynccontextmanager
async def _traffic(url: str, model: str, *, stream: bool) -> AsyncIterator[None]:
    """Requests for ``model`` one after the other while the block runs (streamed or whole)."""

    async def loop() -> None:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0) as client:
            while True:
                if not stream:
                    await client.completions.create(model=model, prompt="ahoy", max_tokens=3)
                    continue
                chunks = await client.completions.create(
                    model=model, prompt="ahoy", max_tokens=3, stream=True
                )
                async for _chunk in chunks:
                    pass

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(
    ("slo", "stream", "reason"),
    [
        ({"ttft_p95_ms": 20}, False, r"ttft p95 \d+ ms > target 20 ms"),
        ({"itl_p95_ms": 20}, True, r"itl p95 \d+ ms > target 20 ms"),
    ],
)
async def test_a_missed_target_adds_a_copy_that_goes_with_the_traffic(
    fleet_workers, frontend, etcd, namespace, tmp_path: Path, capsys,
    slo: dict[str, float], stream: bool, reason: str,
) -> None:  # fmt: skip
    workers, copies = fleet_workers, _copies
    async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
        assert (await http.post("/v1/adapters", json=_hot(tmp_path, slo))).status_code == 201
        await wait_for_holders(etcd, namespace, copies(1), timeout_s=30)

        async with _traffic(frontend.url, "hot", stream=stream):
            await wait_for_holders(etcd, namespace, copies(2), timeout_s=60)
            shown = (await http.get("/v1/adapters/hot")).json()
            await asyncio.to_thread(print_fleet, frontend.url, as_json=False)  # lora list
        assert "slo copies 2: " in capsys.readouterr().out
        await assert_invariant_everywhere(workers, etcd, namespace)

        attainment = shown["attainment"]
        assert attainment["copies"] == 2
        assert re.fullmatch(reason, attainment["reason"]), attainment
        assert len(shown["instances"]) == 2
        assert shown["demand"] < 70  # demand alone would have kept one copy
        metrics = (await http.get("/metrics")).text
        assert 'lorafleet_frontend_adapter_slo_attainment{adapter="hot"} 0.0' in metrics

        # no traffic: demand decays under 0.1 req/s, the floor no longer holds, and the
        # demand cool-down removes the extra copy
        await wait_for_holders(etcd, namespace, copies(1), timeout_s=60)
        await assert_invariant_everywhere(workers, etcd, namespace)

        # deleted: the next judged window drops its copies record and its series
        assert (await http.delete("/v1/adapters/hot")).status_code == 200
        await _until_forgotten(http, etcd, namespace)


async def _until_forgotten(http: httpx.AsyncClient, etcd, namespace: str) -> None:
    """Poll until no SLO copies record and no attainment series are left."""
    async with asyncio.timeout(30):
        while True:
            records = await etcd.get_prefix(slo_copies_prefix(namespace).encode())
            series = (
                "lorafleet_frontend_adapter_slo_attainment{" in (await http.get("/metrics")).text
            )
            if not records and not series:
                return
            await asyncio.sleep(0.2)


async def test_two_frontends_judge_together_and_store_one_step(
    fleet_workers, frontend_factory, etcd, namespace, tmp_path: Path
) -> None:
    """Both frontends count, both publish a report, both judge each window: one record, one
    copy added, and both show the same reason."""
    frontends = [await asyncio.to_thread(frontend_factory) for _ in range(2)]
    async with httpx.AsyncClient(timeout=30) as http:
        added = await http.post(f"{frontends[0].url}/v1/adapters",
                                json=_hot(tmp_path, {"ttft_p95_ms": 20}))  # fmt: skip
        assert added.status_code == 201
        await wait_for_holders(etcd, namespace, _copies(1), timeout_s=30)
        async with (
            _traffic(frontends[0].url, "hot", stream=False),
            _traffic(frontends[1].url, "hot", stream=True),
        ):
            await wait_for_holders(etcd, namespace, _copies(2), timeout_s=60)
            reports = await etcd.get_prefix(slo_reports_prefix(namespace).encode())
            shown = [await _once_it_shows_copies(http, f.url, 2) for f in frontends]
        assert len(reports) == 2  # one per frontend, under its lease
        records = await etcd.get_prefix(slo_copies_prefix(namespace).encode())
        assert [decode_slo_copies(kv.value).copies for kv in records] == [2]
        reasons = {status["attainment"]["reason"] for status in shown}
        assert len(reasons) == 1 and reasons.pop().startswith("ttft p95 ")


async def _once_it_shows_copies(http: httpx.AsyncClient, url: str, copies: int) -> dict:
    """``hot``'s status at ``url`` once its watch shows the SLO copies record."""
    async with asyncio.timeout(10):
        while True:
            status = (await http.get(f"{url}/v1/adapters/hot")).json()
            if status["attainment"]["copies"] == copies:
                return status
            await asyncio.sleep(0.1)
