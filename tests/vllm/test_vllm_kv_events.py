"""vLLM's KV events relayed by the vllm engine: the fleet's hashes of the prompt's tokens.

The same long prompt twice to an adapter: vLLM's prefix cache answers the second from
cache (its counters say so), and the blocks relayed are exactly those a frontend computes
from the model's tokenizer, under the adapter's version and the request's cache salt.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from prometheus_client import REGISTRY
from transformers import AutoTokenizer

from lorafleet.fleet.kv_blocks import block_hashes
from lorafleet.launch.demo_model import DEMO_MODEL_NAME, DemoModelPaths
from lorafleet.proto.inference import GenerateRequest, SamplingParams
from lorafleet.proto.kv_events import BlocksStored
from tests.vllm.answers import answer
from tests.vllm.conftest import KvEventLog

PROMPT: Final = " ".join(["Tell me a joke about the seven seas and a tiny robot."] * 12)
SALT: Final = "kv-events-test"
"""This test's own salt: no other test's blocks share its chain."""


def _hits() -> float:
    labels = {"model_name": DEMO_MODEL_NAME, "lora_name": "pirate"}
    return REGISTRY.get_sample_value("vllm:prefix_cache_hits_total", labels) or 0.0


async def test_a_prompt_sent_twice_hits_and_its_blocks_are_relayed_as_the_fleet_hashes_them(
    engine: Any, kv_events: KvEventLog, demo: DemoModelPaths
) -> None:
    spec = engine.kv_cache_spec()
    assert spec is not None and spec.tokenizer == "hf" and spec.num_blocks > 0
    tokens = AutoTokenizer.from_pretrained(demo.base).encode(PROMPT)
    expected = block_hashes(tokens, spec.block_size, "pirate", SALT)
    assert expected, "the prompt must fill at least one block"
    hits_before = _hits()
    cached: list[int | None] = []
    for index in (1, 2):
        sampling = SamplingParams(max_tokens=2)
        request = GenerateRequest(
            request_id=f"kv-{index}", model="pirate", prompt=PROMPT, cache_salt=SALT,
            sampling=sampling,
        )  # fmt: skip
        cached.append((await answer(engine, request)).final.usage.cached_tokens)
    assert _hits() - hits_before == len(expected) * spec.block_size
    assert cached == [0, len(expected) * spec.block_size]  # the answers' usage says so too

    def stored() -> set[int]:
        return {h for e in kv_events.events if isinstance(e, BlocksStored)
                and e.version == "pirate" for h in e.hashes}  # fmt: skip

    async with asyncio.timeout(30):
        while not set(expected) <= stored():
            await kv_events.arrived()
