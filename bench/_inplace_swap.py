"""``bench.rollout``'s in-place swap: one adapter's weights replaced on a worker under load.

One worker (the mocker, or the hf engine on the demo model) holds adapter ``swap`` loaded
straight onto it; ``concurrency`` clients loop on ``swap`` through a frontend while the
worker's own load route swaps it with ``replace: true`` (vLLM's ``load_inplace``).

Which weights answered: the mocker names the version in its tokens (engine option
``name_version``); the hf engine's greedy answer differs between the demo's ``pirate``
and ``robot`` adapters (the old answer is read before the swap, the new one after).
The worker's resident memory is read from ``/proc/<pid>/status`` every ``SAMPLE_S``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from bench._cluster import BenchCluster, Service, make_adapter_dir
from lorafleet.launch.demo_model import EXPECTED_PROMPT, ensure_demo_model

__all__ = ["swap_under_load"]

ADAPTER: Final = "swap"
SAMPLE_S: Final = 0.01
READY_TIMEOUT_S: Final = 120.0


@dataclass
class _Answers:
    """(start, end, text) of each 200 and (start, end, status) of each error."""

    ok: list[tuple[float, float, str]] = field(default_factory=list)
    failed: list[tuple[float, float, int]] = field(default_factory=list)


@dataclass
class _Rss:
    """The worker's resident memory, sampled: (when, bytes)."""

    samples: list[tuple[float, int]] = field(default_factory=list)

    def mean_mb(self, start: float, end: float) -> float:
        within = [rss for at, rss in self.samples if start <= at <= end]
        return round(sum(within) / max(1, len(within)) / 2**20, 1)

    def peak_mb(self, start: float, end: float) -> float:
        return round(max((r for at, r in self.samples if start <= at <= end), default=0) / 2**20, 1)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS")


@asynccontextmanager
async def _sampling(pid: int) -> AsyncIterator[_Rss]:
    rss = _Rss()

    async def sample() -> None:
        while True:
            rss.samples.append((time.monotonic(), _rss_bytes(pid)))
            await asyncio.sleep(SAMPLE_S)

    task = asyncio.create_task(sample())
    try:
        yield rss
    finally:
        task.cancel()


async def _client(http: httpx.AsyncClient, url: str, body: dict[str, Any], answers: _Answers,
                  stop: asyncio.Event) -> None:  # fmt: skip
    while not stop.is_set():
        started = time.monotonic()
        response = await http.post(f"{url}/v1/chat/completions", json=body)
        if response.status_code == 200:
            text = response.json()["choices"][0]["message"]["content"]
            answers.ok.append((started, time.monotonic(), text))
        else:
            answers.failed.append((started, time.monotonic(), response.status_code))


async def _load(http: httpx.AsyncClient, worker: Service, uri: str, replace: bool) -> str:
    body = {"lora_name": ADAPTER, "source": {"uri": uri}, "replace": replace}
    response = await http.post(f"{worker.url}/engine/update/load_lora", json=body)
    response.raise_for_status()
    digest: str = response.json()["digest"]
    return digest


async def _served(http: httpx.AsyncClient, url: str) -> None:
    async with asyncio.timeout(READY_TIMEOUT_S):
        while ADAPTER not in {m["id"] for m in (await http.get(f"{url}/v1/models")).json()["data"]}:
            await asyncio.sleep(0.05)


def _versions(engine: str, root: Path) -> tuple[str, str]:
    """The two sources of ``swap``: old and new weights."""
    if engine == "hf":
        demo = ensure_demo_model()
        return f"file://{demo.adapters['pirate']}", f"file://{demo.adapters['robot']}"
    old = make_adapter_dir(root / "v1", ADAPTER)
    new = make_adapter_dir(root / "v2", ADAPTER, weights=b"\x01" * 16)  # other weights, digest
    return f"file://{old}", f"file://{new}"


def _worker(cluster: BenchCluster, engine: str, time_per_token_s: float) -> Service:
    if engine == "hf":
        base = str(ensure_demo_model().base)
        return cluster.worker(base, "--enable-lora", "--served-model-name", "demo", engine="hf")
    return cluster.worker("demo", "--enable-lora", "--engine-option", "name_version=true",
                          "--mocker-time-per-token-s", str(time_per_token_s))  # fmt: skip


async def swap_under_load(
    engine: str, *, concurrency: int, settle_s: float, time_per_token_s: float
) -> dict[str, Any]:
    """Swap ``swap`` from old to new weights under load; the figures of one swap."""
    with BenchCluster() as cluster:
        worker = _worker(cluster, engine, time_per_token_s)
        frontend = cluster.frontend()
        old_uri, new_uri = _versions(engine, cluster.root / "swap")
        prompt = EXPECTED_PROMPT if engine == "hf" else "hi"
        body = {"model": ADAPTER, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 8 if engine == "hf" else 4, "temperature": 0}  # fmt: skip
        async with httpx.AsyncClient(timeout=60) as http:
            old_digest = await _load(http, worker, old_uri, replace=False)
            await _served(http, frontend.url)
            answers, stop = _Answers(), asyncio.Event()
            async with _sampling(worker.pid) as rss:
                before = time.monotonic()
                clients = [asyncio.create_task(_client(http, frontend.url, body, answers, stop))
                           for _ in range(concurrency)]  # fmt: skip
                await asyncio.sleep(settle_s)
                called = time.monotonic()
                new_digest = await _load(http, worker, new_uri, replace=True)
                returned = time.monotonic()
                await asyncio.sleep(settle_s)
                stop.set()
                await asyncio.gather(*clients)
                after = time.monotonic()
            old_text = _text_of(answers, before, called)
            new_text = _text_of(answers, returned, after)
    if engine == "mocker":  # the tokens name the version key: name@<12 hex>
        old_text = f"{ADAPTER}@{old_digest.removeprefix('sha256:')[:12]}:0"
        new_text = f"{ADAPTER}@{new_digest.removeprefix('sha256:')[:12]}:0"
    old = [(s, e) for s, e, text in answers.ok if text.startswith(old_text)]
    new = [(s, e) for s, e, text in answers.ok if text.startswith(new_text)]
    last_old_start = max((s for s, _ in old), default=called)
    last_old_end = max((e for _, e in old), default=called)
    return {
        "engine": engine,
        "requests": len(answers.ok) + len(answers.failed),
        "failed": len(answers.failed),
        "answers_old_version": len(old),
        "answers_new_version": len(new),
        "answers_neither_version": len(answers.ok) - len(old) - len(new),
        "swap_call_ms": _ms(returned - called),
        "only_new_for_requests_started_after_ms": _ms(last_old_start - called),
        "old_version_drained_after_ms": _ms(last_old_end - called),
        "old_answers_after_call": sum(1 for _, e in old if e > called),
        "rss_mb_before": rss.mean_mb(before, called),
        "rss_mb_peak_during_swap": rss.peak_mb(called, returned),
        "rss_mb_after": rss.mean_mb(returned + settle_s / 2, after),
    }


def _text_of(answers: _Answers, start: float, end: float) -> str:
    """The answer most requests that ran wholly within [start, end] got."""
    texts = [text for s, e, text in answers.ok if start <= s and e <= end]
    return max(set(texts), key=texts.count) if texts else "<none>"


def _ms(seconds: float) -> float:
    return round(max(0.0, seconds) * 1000, 1)
