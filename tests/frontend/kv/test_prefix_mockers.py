"""The prefix router over real mocker workers (their paged caches and KV relays): shared
prompts land where they are cached, as the workers' own prefix-cache counters show."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import httpx
import openai

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.config import FrontendConfig
from tests.frontend.conftest import FAST_DISPATCH, run_frontend, wait_for_models
from tests.processes import ServiceProcess

PROMPTS = [" ".join(f"p{k}w{n}" for n in range(400)) for k in range(4)]
"""Four system prompts of 400 words: 25 whole blocks of the mocker's 16 word tokens."""
ROUNDS = 3


def _hits(worker: ServiceProcess) -> float:
    text = httpx.get(f"{worker.url}/metrics").text
    return sum(map(float, re.findall(r"^vllm:prefix_cache_hits_total\{.*\} (\S+)$", text, re.M)))


async def test_shared_prompts_are_computed_once_across_mocker_workers(
    lora_workers: Callable[..., list[ServiceProcess]], etcd_url: str, nats_url: str,
    namespace: str,
) -> None:  # fmt: skip
    workers = await asyncio.to_thread(lora_workers, 3)
    etcd = EtcdSettings.from_endpoints(etcd_url)
    config = FrontendConfig(namespace=namespace, etcd=etcd, nats_server=nats_url,
                            dispatch=FAST_DISPATCH, router="prefix")  # fmt: skip
    async with run_frontend(config) as frontend:
        await wait_for_models(frontend, {"demo"}, timeout_s=60)
        client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="-", max_retries=0)
        cached: list[int] = []
        for round_ in range(ROUNDS):
            for prompt in PROMPTS:
                answer = await client.chat.completions.create(
                    model="demo", max_tokens=4,
                    messages=[{"role": "system", "content": prompt},
                              {"role": "user", "content": f"question {round_}"}],
                )  # fmt: skip
                assert answer.usage is not None and answer.usage.prompt_tokens_details
                cached.append(answer.usage.prompt_tokens_details.cached_tokens or 0)
    ideal = len(PROMPTS) * (ROUNDS - 1) * 400  # every later round finds its prompt cached
    assert sum(_hits(w) for w in workers) >= 0.9 * ideal
    # The client reads the same hits in each answer's usage, as from vLLM.
    assert cached[: len(PROMPTS)] == [0] * len(PROMPTS)
    assert sum(cached) == sum(_hits(w) for w in workers)
