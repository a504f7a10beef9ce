"""What must hold all through a fault (issue 27), checked while the fault lasts.

- Cards: every card in etcd names an adapter its worker holds, and every adapter a
  worker holds has its card while the worker's lease is held (``CardChecker``).
- Answers: no chat gets another model's answer (``etcd_scenarios.Load``; ``Streams``).
- Streams: each completes or ends with an error event; none hangs (``Streams``).

Written once for ``tests/chaos/test_partitions.py`` and the multi-host cases of
``tests/chaos/test_topology.py``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final

import httpx
import openai

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.errors import EtcdUnavailableError
from lorafleet.discovery.keys import card_prefix, instance_prefix, parse_card_key
from lorafleet.proto.discovery import decode_card
from tests.etcd_scenarios import ADAPTER, names_only

SAMPLE_INTERVAL_S: Final = 0.05
STREAM_TIMEOUT_S: Final = 30.0
"""A stream that has not ended after this long hangs."""


@dataclass
class Streams:
    """Streamed chats of ``model`` in a closed loop, counted until ``stop``.

    Broken: it erred or ended without a finish reason. Hung: no end within
    ``STREAM_TIMEOUT_S`` (also broken). Wrong: a token another model made.
    """

    frontend_url: str
    model: str = ADAPTER
    sent: int = 0
    broken: int = 0
    hung: int = 0
    wrong: int = 0
    errors: list[str] = field(default_factory=list)

    async def run(self, stop: asyncio.Event, clients: int = 2) -> None:
        client = openai.AsyncOpenAI(
            base_url=f"{self.frontend_url}/v1", api_key="unused", max_retries=0,
            timeout=STREAM_TIMEOUT_S,
        )  # fmt: skip
        async with client:
            await asyncio.gather(*(self._loop(client, stop) for _ in range(clients)))

    async def _loop(self, client: openai.AsyncOpenAI, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sent += 1
            finished, text = False, ""
            try:
                stream = await client.chat.completions.create(
                    model=self.model, messages=[{"role": "user", "content": "hi"}],
                    max_tokens=16, stream=True,
                )  # fmt: skip
                async for chunk in stream:
                    finished = finished or any(c.finish_reason for c in chunk.choices)
                    text += "".join(c.delta.content or "" for c in chunk.choices)
            except openai.APITimeoutError:
                self.hung += 1
            except (openai.OpenAIError, httpx.TransportError) as exc:  # the latter mid-stream
                self.errors.append(f"stream of {self.model}: {exc!r}")
            self.broken += not finished
            self.wrong += not names_only(text, self.model)


@dataclass(frozen=True)
class WorkerView:
    """What a worker said of itself in one sample: its instance, adapters and lease."""

    instance: str
    held: frozenset[str]
    lease_held: bool


@dataclass
class CardChecker:
    """Compares each worker's adapters with its cards in etcd, every ``SAMPLE_INTERVAL_S``.

    One sample asks every worker, lists the cards, and asks every worker again. A card
    is wrong if its worker held its adapter neither time; an adapter of ``published``
    (loaded before the checks began, so published) is missing if the worker held it and
    its lease both times, yet etcd has no card for it. A sample whose listing fails (the
    checker's own etcd member cut off) is skipped, as is one that a worker's status
    server did not answer (counted in ``unanswered``).
    """

    etcd: EtcdClient
    namespace: str
    worker_urls: list[str]
    published: set[str]
    violations: list[str] = field(default_factory=list)
    samples: int = 0
    unanswered: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            while not stop.is_set():
                try:
                    await self.sample(client)
                except httpx.TransportError:  # e.g. a keep-alive connection closed under us
                    self.unanswered += 1
                await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def sample(self, client: httpx.AsyncClient) -> None:
        before = [await worker_view(client, url) for url in self.worker_urls]
        try:
            with self.etcd.errors("list cards"):
                cards = await self.etcd.get_prefix(card_prefix(self.namespace).encode())
        except EtcdUnavailableError:
            return
        after = [await worker_view(client, url) for url in self.worker_urls]
        published: dict[str, set[str]] = {}
        for kv in cards:
            card = decode_card(kv.value)
            if card.lora is not None:
                instance = f"{parse_card_key(kv.key.decode())[1]:x}"
                published.setdefault(instance, set()).add(card.lora.name)
        for first, second in zip(before, after, strict=True):
            self._compare(first, second, published.get(first.instance, set()))
        self.samples += 1

    def _compare(self, first: WorkerView, second: WorkerView, cards: set[str]) -> None:
        for name in cards - (first.held | second.held):
            self.violations.append(f"card of {name} on {first.instance}, which holds "
                                   f"{sorted(first.held | second.held)}")  # fmt: skip
        if first.lease_held and second.lease_held:
            for name in (first.held & second.held & self.published) - cards:
                self.violations.append(f"{first.instance} holds {name} with its lease "
                                       "held, but etcd has no card for it")  # fmt: skip


async def worker_view(client: httpx.AsyncClient, worker_url: str) -> WorkerView:
    """Ask a worker (its status server) for its instance, adapters and lease."""
    health = (await client.get(f"{worker_url}/health")).json()
    loras = await client.post(f"{worker_url}/engine/update/list_loras", json={})
    held = frozenset(loras.json()["loras"])
    return WorkerView(health["instance_id"], held, health.get("etcd") == "lease held")


async def keys_of(etcd: EtcdClient, namespace: str, instance: str) -> list[str]:
    """The instance record and cards of one worker (``instance`` in hex) in etcd now."""
    keys = []
    for prefix in (instance_prefix(namespace), card_prefix(namespace)):
        for kv in await etcd.get_prefix(prefix.encode()):
            key = kv.key.decode()
            if key.endswith(f"/{instance}") or f"/{instance}/" in key:
                keys.append(key)
    return keys
