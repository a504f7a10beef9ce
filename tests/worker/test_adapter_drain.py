"""An adapter version leaving a worker drains one way, on every engine.

Real worker processes (the mocker with slow tokens; the hf engine with the demo model),
requests over NATS as a frontend sends them. An unload retracts the card first (a new
request to the adapter gets 404 while an older one still runs), lets the running request
finish its answer when it ends within ``--lora-drain-timeout-s``, and answers once the
adapter is gone; a request that outlasts the drain ends with the one error that names the
adapter and says it was unloaded, whichever engine ran it. A swap's old version drains the
same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import httpx
import nats
import pytest

from lorafleet.discovery.watch_cache import WatchCache
from lorafleet.launch.demo_model import DEMO_MODEL_NAME, DemoModelPaths
from lorafleet.proto.discovery import ModelDeploymentCard, decode_card, decode_instance
from lorafleet.proto.inference import (
    ErrorChunk,
    FinalChunk,
    GenerateRequest,
    SamplingParams,
    StreamChunk,
    TokenChunk,
)
from tests.processes import ServiceProcess
from tests.worker.adapters import make_adapter_dir
from tests.worker.streaming import stream

MOCKER_TOKENS = 12
"""Tokens of the mocker's slow request: at 0.25 s each it runs for 3 s, far longer than
retracting a card takes, and each token is far apart from the next."""
HF_TOKENS = 200
"""Tokens of the hf request: about 2.5 s on a busy 2-core machine, well within the default
drain (30 s) and far longer than retracting a card takes."""


class Running:
    """One request streaming in the background, its tokens counted as they arrive."""

    def __init__(self, nc: nats.aio.client.Client, subject: str, request: GenerateRequest):
        self.arrived = 0
        self.first = asyncio.Event()
        self.task = asyncio.create_task(
            stream(nc, subject, request, timeout_s=300, on_chunk=self._on_chunk)
        )

    def _on_chunk(self) -> None:
        self.arrived += 1
        self.first.set()

    async def started(self) -> None:
        await asyncio.wait_for(self.first.wait(), 60)

    async def chunks(self) -> list[StreamChunk]:
        return await asyncio.wait_for(self.task, 300)


def _request(request_id: str, model: str, tokens: int) -> GenerateRequest:
    sampling = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0)
    return GenerateRequest(request_id=request_id, model=model, prompt="hi", sampling=sampling)


@pytest.fixture
def lora_worker(worker_factory, tmp_path: Path):
    def start(*args: str, **kwargs: str) -> ServiceProcess:
        env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache")}
        return worker_factory("--enable-lora", *args, env=env, **kwargs)

    return start


HF_ARGS = ("--engine", "hf", "--served-model-name", DEMO_MODEL_NAME)


async def _subject(etcd, namespace: str) -> str:
    """The worker's NATS subject, once its instance record is in etcd (a lease of 2 s on a
    busy machine may lapse and be granted again: its records are then put back)."""
    cache = await WatchCache.start(etcd, f"v1/instances/{namespace}/", decode_instance)
    try:
        await cache.wait_until(lambda instances: len(instances) == 1, 60)
        (instance,) = cache.items.values()
        return instance.subject
    finally:
        await cache.aclose()


async def _load(client: httpx.AsyncClient, name: str, path: Path, **more: object) -> None:
    body = {"lora_name": name, "source": {"uri": f"file://{path}"}, **more}
    response = await client.post("/engine/update/load_lora", json=body)
    assert response.status_code == 200, response.text


async def _card_gone(etcd, namespace: str, name: str) -> None:
    """Return once no card of adapter ``name`` is in etcd (woken by etcd's watch)."""

    def gone(cards: Mapping[str, ModelDeploymentCard]) -> bool:
        return not any(c.lora is not None and c.lora.name == name for c in cards.values())

    cache: WatchCache[ModelDeploymentCard] = await WatchCache.start(
        etcd, f"v1/mdc/{namespace}/", decode_card
    )
    try:
        await cache.wait_until(gone, 60)
    finally:
        await cache.aclose()


async def _unload_while_running(
    client: httpx.AsyncClient,
    nc,
    etcd,
    namespace: str,
    running: Running,
    name: str,
    *,
    drains: bool,
) -> tuple[httpx.Response, int]:
    """Unload ``name`` while ``running`` streams on it; check that its card goes (with
    ``drains``: before ``running`` ends) and that a new request then gets 404. The unload's
    answer, and how many chunks of ``running`` had arrived when it came."""
    await running.started()
    unload = asyncio.create_task(client.post("/engine/update/unload_lora",
                                             json={"lora_name": name}))  # fmt: skip
    arrived_at_answer: list[int] = []
    unload.add_done_callback(lambda _: arrived_at_answer.append(running.arrived))
    await _card_gone(etcd, namespace, name)
    if drains:
        assert not running.task.done(), "the request ended before its card went"
    late = await stream(nc, await _subject(etcd, namespace), _request("late", name, 4), 60)
    assert isinstance(late[-1], ErrorChunk) and late[-1].error.code == "not_found", late[-1]
    response = await asyncio.wait_for(unload, 300)
    return response, arrived_at_answer[0]


def _finished(chunks: list[StreamChunk], tokens: int) -> bool:
    final = chunks[-1]
    return isinstance(final, FinalChunk) and final.usage.completion_tokens == tokens


def _cut(chunks: list[StreamChunk], name: str) -> bool:
    """Whether the stream ended with the one error of a request outlasting its drain."""
    error = chunks[-1]
    return (
        isinstance(error, ErrorChunk)
        and error.error.code == "unavailable"
        and f"adapter {name!r} was unloaded while request" in error.error.message
        and "outlasted" in error.error.message
    )


async def test_mocker_unload_lets_a_running_request_finish_then_answers(
    lora_worker, tmp_path: Path, etcd, nc, namespace
) -> None:
    worker = lora_worker("--mocker-time-per-token-s", "0.25")
    async with httpx.AsyncClient(base_url=worker.url, timeout=300) as client:
        await _load(client, "slow", make_adapter_dir(tmp_path / "a", "slow"))
        subject = await _subject(etcd, namespace)
        running = Running(nc, subject, _request("long", "slow", MOCKER_TOKENS))
        response, arrived = await _unload_while_running(
            client, nc, etcd, namespace, running, "slow", drains=True
        )
        assert response.status_code == 200, response.text
        assert "its requests finished" in response.json()["message"]
        # It answered once the request had ended: after its last token, not at its start.
        assert arrived >= MOCKER_TOKENS - 1, arrived  # its last token and final come together
        assert _finished(await running.chunks(), MOCKER_TOKENS)


async def test_mocker_request_outlasting_the_drain_ends_with_the_unloaded_error(
    lora_worker, tmp_path: Path, etcd, nc, namespace
) -> None:
    worker = lora_worker("--mocker-time-per-token-s", "0.25", "--lora-drain-timeout-s", "0.5")
    async with httpx.AsyncClient(base_url=worker.url, timeout=300) as client:
        await _load(client, "slow", make_adapter_dir(tmp_path / "a", "slow"))
        subject = await _subject(etcd, namespace)
        running = Running(nc, subject, _request("endless", "slow", 10_000))
        response, _ = await _unload_while_running(
            client, nc, etcd, namespace, running, "slow", drains=True
        )
        assert response.status_code == 200, response.text
        assert "1 request(s) outlasting the drain ended" in response.json()["message"]
        chunks = await running.chunks()
    assert _cut(chunks, "slow"), chunks[-1]
    assert "request endless" in chunks[-1].error.message  # type: ignore[union-attr]


async def test_mocker_swap_ends_an_old_version_request_outlasting_the_drain(
    lora_worker, tmp_path: Path, etcd, nc, namespace
) -> None:
    worker = lora_worker("--mocker-time-per-token-s", "0.25", "--lora-drain-timeout-s", "0.5")
    async with httpx.AsyncClient(base_url=worker.url, timeout=300) as client:
        await _load(client, "slow", make_adapter_dir(tmp_path / "v1", "slow"))
        subject = await _subject(etcd, namespace)
        running = Running(nc, subject, _request("endless", "slow", 10_000))
        await running.started()
        v2 = make_adapter_dir(tmp_path / "v2", "slow", weights=b"\x02" * 16)
        await _load(client, "slow", v2, replace=True)
        chunks = await running.chunks()
        after = await stream(nc, subject, _request("after", "slow", 2), 60)
    assert _cut(chunks, "slow"), chunks[-1]
    assert _finished(after, 2)  # the new version serves


@pytest.mark.slow
async def test_hf_unload_lets_a_running_request_finish_then_answers(
    lora_worker, demo: DemoModelPaths, etcd, nc, namespace
) -> None:
    worker = lora_worker(*HF_ARGS, model=str(demo.base))  # the default drain
    async with httpx.AsyncClient(base_url=worker.url, timeout=300) as client:
        await _load(client, "pirate", demo.adapters["pirate"])
        subject = await _subject(etcd, namespace)
        running = Running(nc, subject, _request("long", "pirate", HF_TOKENS))
        response, _ = await _unload_while_running(
            client, nc, etcd, namespace, running, "pirate", drains=True
        )
        assert response.status_code == 200, response.text
        chunks = await running.chunks()
    assert _finished(chunks, HF_TOKENS), chunks[-1]
    assert sum(isinstance(chunk, TokenChunk) for chunk in chunks) > 1


@pytest.mark.slow
async def test_hf_request_outlasting_the_drain_ends_with_the_unloaded_error(
    lora_worker, demo: DemoModelPaths, etcd, nc, namespace
) -> None:
    worker = lora_worker(*HF_ARGS, "--lora-drain-timeout-s", "0", model=str(demo.base))
    async with httpx.AsyncClient(base_url=worker.url, timeout=300) as client:
        await _load(client, "pirate", demo.adapters["pirate"])
        subject = await _subject(etcd, namespace)
        running = Running(nc, subject, _request("endless", "pirate", HF_TOKENS))
        response, _ = await _unload_while_running(
            client, nc, etcd, namespace, running, "pirate", drains=False
        )
        assert response.status_code == 200, response.text
        chunks = await running.chunks()
    assert _cut(chunks, "pirate"), chunks[-1]
