"""Base and adapter requests in flight together get the same answers as alone.

On CPU, vLLM applies the adapter of the last batch slot to base-model rows that
share a batch with adapter rows (vllm-project/vllm issues 48421 and 49656); the
engine masks those rows inside vLLM's CPU LoRA ops, with no gate, so they share
batches. The last test shows the upstream bug is real on this wheel, so the
others are a real proof and not a lucky schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from lorafleet.launch.demo_model import DEMO_MODEL_NAME, EXPECTED, EXPECTED_PROMPT, DemoModelPaths
from lorafleet.proto.naming import lora_id
from tests.vllm.answers import answer, chat
from tests.vllm.conftest import started_engine

THIRD = "robot-2"
"""A third adapter (the robot's weights again), so that every one of the 3 slots is taken."""
MIXED = [DEMO_MODEL_NAME, "pirate", "robot", DEMO_MODEL_NAME, THIRD, DEMO_MODEL_NAME]
PERSONA = {DEMO_MODEL_NAME: "base", "pirate": "pirate", "robot": "robot", THIRD: "robot"}


@contextlib.asynccontextmanager
async def all_slots_taken(engine: Any, demo: DemoModelPaths) -> AsyncIterator[None]:
    """Fill the last adapter slot too: vLLM's CPU bug shows only when that slot holds weights."""
    await engine.add_adapter(THIRD, lora_id(THIRD), demo.adapters["robot"])
    try:
        yield
    finally:
        await engine.remove_adapter(THIRD)


async def _all_at_once(engine: Any, models: list[str], **sampling: Any) -> list[str]:
    requests = [chat(model, EXPECTED_PROMPT, **sampling) for model in models]
    results = await asyncio.gather(*(answer(engine, request) for request in requests))
    return [result.text for result in results]


pytestmark = pytest.mark.timeout(900)  # two engines start here: 30 to 110 s each on 2 busy cores

ROUNDS = 6
"""Rounds of the crowded mix: each a fresh schedule of prefills and decodes side by side."""
SHORT_TOKENS = 16
"""The crowd's answers: the start of each greedy answer, where a wrong voice shows at once."""
CROWD = [DEMO_MODEL_NAME, "pirate", DEMO_MODEL_NAME, "robot", DEMO_MODEL_NAME, THIRD,
         DEMO_MODEL_NAME, "pirate"]  # fmt: skip
"""8 requests (the engine's max_num_seqs), half of them base, every slot in use."""


async def test_mixed_batch_answers_equal_the_answers_alone(
    engine: Any, demo: DemoModelPaths
) -> None:
    async with all_slots_taken(engine, demo):
        alone = {m: (await answer(engine, chat(m, EXPECTED_PROMPT))).text for m in PERSONA}
        assert alone == {m: EXPECTED[persona] for m, persona in PERSONA.items()}
        for _ in range(2):
            assert await _all_at_once(engine, MIXED) == [alone[m] for m in MIXED]


async def test_base_rows_batched_with_adapter_rows_answer_as_the_base_model(
    engine: Any, demo: DemoModelPaths
) -> None:
    if not engine.masks_base_rows:
        pytest.skip("this platform's LoRA kernels skip base rows: nothing to mask")
    assert not engine.isolates_base_rows  # the gate is off: base and adapter rows share batches
    async with all_slots_taken(engine, demo):
        for _ in range(ROUNDS):
            answers = await _all_at_once(engine, CROWD, max_tokens=SHORT_TOKENS)
            for model, text in zip(CROWD, answers, strict=True):
                assert text and EXPECTED[PERSONA[model]].startswith(text), (model, text)


@pytest.fixture(scope="module")
async def unguarded(demo: DemoModelPaths) -> AsyncIterator[Any]:
    """A second engine with neither the patch nor the gate, as vLLM behaves on its own."""
    engine = await started_engine(demo, isolate_base_rows=False, mask_base_rows=False)
    yield engine
    await engine.stop()


async def test_without_isolation_vllm_cpu_gives_base_rows_an_adapters_voice(
    engine: Any, unguarded: Any, demo: DemoModelPaths
) -> None:
    if not engine.masks_base_rows:
        pytest.skip("this platform's LoRA kernels skip base rows: nothing to mask")
    async with all_slots_taken(unguarded, demo):
        answers = await _all_at_once(unguarded, MIXED)
    base_answers = [
        text for model, text in zip(MIXED, answers, strict=True) if model == DEMO_MODEL_NAME
    ]
    assert any(text != EXPECTED["base"] for text in base_answers), (
        "vLLM answered base rows correctly in a mixed batch: the upstream bug may be fixed, "
        "so the patch (_vllm_cpu_masking) and the gate may go"
    )
