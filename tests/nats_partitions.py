"""NATS partitions (issue 27, cases 4 and 5), written once and run with the durations given.

``tests/chaos/test_nats_partitions.py`` (``make test-chaos``) runs them several times and
prints the figures quoted in ``docs/faults.md``; ``check`` holds what each must show.

Three nats-servers in a ``RoutedCluster`` (every route through a proxy). Mocker workers
W0, W1, W2 run on servers 0, 1 and 2, each knowing only its own server; frontend F0 runs
on server 0, F2 on server 2. All serve ``demo``; W0 and W2 hold ``pirate``; only W2 holds
``parrot``. So when W2's routes go, ``demo`` and ``pirate`` keep a healthy path from F0
and ``parrot`` has none: its requests through F0 must fail fast, saying why. Through F2
every model keeps a path (W2). No other request may fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
import openai

from tests.nats_faults import RoutedCluster, start_routed_cluster
from tests.processes import ServiceProcess, start_frontend, start_worker
from tests.worker.adapters import make_adapter_dir

BASE: Final = "demo"
SHARED: Final = "pirate"
"""Held by W0 (frontend's side) and W2."""
ONLY_W2: Final = "parrot"
"""Held by W2 alone: no healthy path while W2 is cut off."""
MODELS: Final = (BASE, SHARED, ONLY_W2)
ADAPTERS_OF: Final = ((SHARED,), (), (SHARED, ONLY_W2))
CUT_OFF: Final = 2
"""The server (and worker) the partitions cut off from the frontend's server 0."""
WAIT_S: Final = 60.0
FAIL_FAST_S: Final = 1.0
"""Issue 27: a request with no healthy path fails within this long."""


@dataclass
class PartitionFleet:
    """The cluster, the workers (``workers[i]`` on server ``i``) and the frontends (F0 on
    server 0, F2 on server ``CUT_OFF``)."""

    cluster: RoutedCluster
    workers: list[ServiceProcess]
    instances: list[str]
    """Each worker's instance id, hex, as ``/health`` names it."""
    frontends: list[ServiceProcess]

    async def unreachable(self, frontend: int = 0) -> dict[str, str]:
        """The instances a frontend keeps out of routing, and why."""
        url = self.frontends[frontend].url
        async with httpx.AsyncClient(timeout=10) as client:
            return (await client.get(f"{url}/health")).json()["unreachable"]

    async def requests_served(self) -> list[float]:
        """Each worker's count of generate requests handled (``/metrics``)."""
        counts = []
        async with httpx.AsyncClient(timeout=10) as client:
            for worker in self.workers:
                text = (await client.get(f"{worker.url}/metrics")).text
                found = re.findall(r"^lorafleet_worker_requests_total\{[^}]*\} (\S+)$", text, re.M)
                counts.append(sum(float(value) for value in found))
        return counts


@contextlib.asynccontextmanager
async def partition_fleet(
    tmp_path: Path, *, etcd_url: str, namespace: str
) -> AsyncIterator[PartitionFleet]:
    """Start the cluster, the workers with their adapters and the frontend; wait until the
    frontend serves every model; stop everything at the end."""
    cluster = await start_routed_cluster(tmp_path / "nats")
    started: list[ServiceProcess] = []
    try:
        for index, server in enumerate(cluster.servers):
            env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / f"cache{index}")}
            started.append(await asyncio.to_thread(
                start_worker, tmp_path, etcd_url=etcd_url, nats_url=server.url,
                namespace=namespace, args=("--enable-lora",), env=env, wait=False,
            ))  # fmt: skip
        for worker in started:
            await asyncio.to_thread(worker.wait_ready)
        instances = [
            await _load_adapters(tmp_path, w, ADAPTERS_OF[i]) for i, w in enumerate(started)
        ]
        workers = list(started)
        for server in (cluster.servers[0], cluster.servers[CUT_OFF]):
            started.append(await asyncio.to_thread(
                start_frontend, tmp_path, etcd_url=etcd_url, nats_url=server.url,
                namespace=namespace,
            ))  # fmt: skip
        fleet = PartitionFleet(cluster, workers, instances, started[len(workers) :])
        async with asyncio.timeout(WAIT_S):
            for frontend in fleet.frontends:
                while not all([await _answers(frontend.url, model) for model in MODELS]):
                    await asyncio.sleep(0.1)
        yield fleet
    finally:
        for process in started:
            process.kill()
        await cluster.aclose()


async def _load_adapters(tmp_path: Path, worker: ServiceProcess, names: tuple[str, ...]) -> str:
    """Load ``names`` on ``worker``; return its instance id."""
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:
        for name in names:
            uri = f"file://{make_adapter_dir(tmp_path / 'adapters', name)}"
            body = {"lora_name": name, "source": {"uri": uri}}
            response = await client.post("/engine/update/load_lora", json=body)
            assert response.status_code == 200, response.text
        instance: str = (await client.get("/health")).json()["instance_id"]
        return instance


async def _answers(frontend_url: str, model: str) -> bool:
    async with _openai(frontend_url) as client:
        try:
            await client.chat.completions.create(model=model, messages=_HI, max_tokens=2)
        except openai.APIError:
            return False
    return True


_HI: Final = [{"role": "user", "content": "hi"}]


def _openai(frontend_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{frontend_url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S
    )


@dataclass
class ModelLoad:
    """What one model's chats met."""

    sent: int = 0
    failed: int = 0
    wrong: int = 0
    """Answers for another model than the one asked for."""
    slowest_failure_s: float = 0.0
    failed_slowly: int = 0
    """Failures that took longer than ``FAIL_FAST_S``."""
    unexplained: int = 0
    """Failures that were not a 503 saying why the instance was lost."""
    last_success_at: float = 0.0
    successes_at: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class PartitionLoad:
    """Closed-loop chats of every model, and streams of the models with a healthy path,
    through the frontend until ``stop``."""

    frontend_url: str
    models: dict[str, ModelLoad] = field(default_factory=lambda: {m: ModelLoad() for m in MODELS})
    streams: ModelLoad = field(default_factory=ModelLoad)
    streams_broken: int = 0
    """Streams that neither finished nor ended with an error: hung or cut short."""
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, clients_per_model: int = 2, streams: int = 2) -> None:
        async with _openai(self.frontend_url) as client:
            chats = [
                self._chats(client, model) for model in MODELS for _ in range(clients_per_model)
            ]
            streamed = [self._streams(client, (BASE, SHARED)[i % 2]) for i in range(streams)]
            await asyncio.gather(*chats, *streamed)

    async def _chats(self, client: openai.AsyncOpenAI, model: str) -> None:
        outcome = self.models[model]
        while not self.stop.is_set():
            outcome.sent += 1
            started = time.monotonic()
            try:
                answer = await client.chat.completions.create(
                    model=model, messages=_HI, max_tokens=4
                )
            except openai.APIError as exc:
                _failed(outcome, started, exc, model)
                await asyncio.sleep(0.05)  # a failing model is not hammered
                continue
            outcome.last_success_at = time.monotonic()
            outcome.successes_at.append(outcome.last_success_at)
            if answer.model != model:
                outcome.wrong += 1
                outcome.errors.append(f"{model}: answered as {answer.model}")

    async def _streams(self, client: openai.AsyncOpenAI, model: str) -> None:
        outcome = self.streams
        while not self.stop.is_set():
            outcome.sent += 1
            started = time.monotonic()
            finished = False
            try:
                async with asyncio.timeout(WAIT_S):
                    stream = await client.chat.completions.create(
                        model=model, messages=_HI, max_tokens=16, stream=True
                    )
                    async for chunk in stream:
                        finished = finished or any(c.finish_reason for c in chunk.choices)
                        if chunk.model != model:
                            outcome.wrong += 1
            except (openai.APIError, TimeoutError) as exc:
                _failed(outcome, started, exc, f"stream of {model}")
                self.streams_broken += isinstance(exc, TimeoutError)
                continue
            if finished:
                outcome.last_success_at = time.monotonic()
            else:
                self.streams_broken += 1


def _failed(outcome: ModelLoad, started: float, exc: Exception, what: str) -> None:
    took_s = time.monotonic() - started
    outcome.failed += 1
    outcome.slowest_failure_s = max(outcome.slowest_failure_s, took_s)
    outcome.failed_slowly += took_s > FAIL_FAST_S
    explained = isinstance(exc, openai.APIStatusError) and exc.status_code == 503
    outcome.unexplained += not (explained and "; last: " in str(exc))
    outcome.errors.append(f"{what} after {took_s:.2f} s: {exc}")


async def _until(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> float:
    """Wait until ``condition()`` (sync or async) is true; return when that was."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s} s for {what}")
        await asyncio.sleep(0.02)


@dataclass
class PartitionFigures:
    """What one partition looked like to the clients, and how long it took to see and heal."""

    fault: str
    sent: int = 0
    failed_with_a_path: int = 0
    """Failed chats or streams of the models that kept a healthy path: the goal is 0."""
    failed_without_a_path: int = 0
    """Failed chats of ``parrot`` (only on the cut-off worker)."""
    slowest_failure_s: float = 0.0
    """Of the failures without a path."""
    failed_slowly: int = 0
    """Failures without a path that took longer than ``FAIL_FAST_S``."""
    unexplained: int = 0
    """Failures without a path that were not a 503 saying why."""
    wrong: int = 0
    streams: int = 0
    streams_broken: int = 0
    detect_s: float = 0.0
    """From the fault until the frontend's ``/health`` names the cut-off worker unreachable."""
    heal_s: float = 0.0
    """From the link's return until the first answer for ``parrot`` (which only the cut-off
    worker holds); every worker must have served a request again soon after."""
    errors: list[str] = field(default_factory=list)


def check(figures: PartitionFigures) -> None:
    """What every NATS partition must show: nothing fails that had a healthy path, no
    wrong answer, no stream hangs, what fails says why, and every worker is back."""
    assert figures.failed_with_a_path == 0, figures.errors
    assert figures.wrong == 0, figures.errors
    assert figures.streams_broken == 0, figures.errors
    assert figures.unexplained == 0, figures.errors


async def partition_under_load(
    fleet: PartitionFleet, fault: str, apply: Callable[[], None], *, hold_s: float
) -> PartitionFigures:
    """Apply ``fault`` under load, hold it ``hold_s``, heal it; returns the figures."""
    load = PartitionLoad(fleet.frontends[0].url)  # F0: parrot has no path while W2 is cut off
    far = PartitionLoad(fleet.frontends[1].url)  # F2: every model has a path (W2)
    running = asyncio.gather(load.run(), far.run(clients_per_model=1, streams=1))
    figures = PartitionFigures(fault)
    try:
        await _until(
            lambda: all(m.last_success_at for run in (load, far) for m in run.models.values()),
            "the load",
        )
        cut_off = fleet.instances[CUT_OFF]
        apply()
        fault_at = time.monotonic()
        seen_at = await _until(lambda: _names(fleet, cut_off), "the frontend to see the fault")
        figures.detect_s = seen_at - fault_at
        await asyncio.sleep(max(0.0, hold_s - figures.detect_s))  # the fault's length
        fleet.cluster.restore()
        restored_at = time.monotonic()
        served = await fleet.requests_served()
        only_w2 = load.models[ONLY_W2]
        await _until(lambda: only_w2.last_success_at > restored_at, "parrot back")
        figures.heal_s = next(t for t in only_w2.successes_at if t > restored_at) - restored_at
        await _until(lambda: _all_served_since(fleet, served), "every worker to serve again")
        await _until(lambda: _none_unreachable(fleet), "every frontend to reach every worker")
        await fleet.cluster.wait_sizes([len(fleet.workers)] * len(fleet.workers))
        await asyncio.sleep(1.0)  # load after the heal
    finally:
        load.stop.set()
        far.stop.set()
        await running
    _count(figures, load, far)
    return figures


async def _names(fleet: PartitionFleet, instance: str) -> bool:
    return instance in await fleet.unreachable()


async def _none_unreachable(fleet: PartitionFleet) -> bool:
    return not any([await fleet.unreachable(i) for i in range(len(fleet.frontends))])


async def _all_served_since(fleet: PartitionFleet, before: list[float]) -> bool:
    now = await fleet.requests_served()
    return all(after > then for after, then in zip(now, before, strict=True))


def _count(figures: PartitionFigures, load: PartitionLoad, far: PartitionLoad) -> None:
    """``load`` went through F0, ``far`` through F2 (where every model has a path)."""
    without = load.models[ONLY_W2]
    with_path = [load.models[BASE], load.models[SHARED], load.streams]
    with_path += [*far.models.values(), far.streams]
    figures.sent = sum(m.sent for m in (*with_path, without))
    figures.failed_with_a_path = sum(m.failed for m in with_path)
    figures.failed_without_a_path = without.failed
    figures.slowest_failure_s = round(without.slowest_failure_s, 2)
    figures.failed_slowly = without.failed_slowly
    figures.unexplained = without.unexplained
    figures.wrong = sum(m.wrong for m in (*with_path, without))
    figures.streams = load.streams.sent + far.streams.sent
    figures.streams_broken = load.streams_broken + far.streams_broken
    figures.errors = [e for m in (*with_path, without) for e in m.errors][:5]
    figures.detect_s = round(figures.detect_s, 2)
    figures.heal_s = round(figures.heal_s, 2)
