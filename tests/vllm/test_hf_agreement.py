"""The hf and vllm engines give the same greedy answers on the demo model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from lorafleet.launch._demo_corpus import ANSWERS
from lorafleet.launch.demo_model import ADAPTER_NAMES, DEMO_MODEL_NAME, DemoModelPaths
from lorafleet.proto.naming import lora_id
from lorafleet.worker.engines.hf import HFEngine
from tests.vllm.answers import answer, chat
from tests.vllm.conftest import vllm_config


@pytest.fixture(scope="module")
async def hf_engine(demo: DemoModelPaths) -> AsyncIterator[HFEngine]:
    engine = HFEngine(vllm_config(demo))
    await engine.start()
    for name in ADAPTER_NAMES:
        await engine.add_adapter(name, lora_id(name), demo.adapters[name])
    yield engine
    await engine.stop()


@pytest.mark.parametrize("model", [DEMO_MODEL_NAME, *ADAPTER_NAMES])
async def test_greedy_answers_of_hf_and_vllm_agree(
    engine: Any, hf_engine: HFEngine, model: str
) -> None:
    for prompt in ANSWERS:
        from_vllm = await answer(engine, chat(model, prompt))
        from_hf = await answer(hf_engine, chat(model, prompt))
        assert from_vllm.text == from_hf.text, prompt
        vllm_usage, hf_usage = from_vllm.final.usage, from_hf.final.usage
        assert vllm_usage is not None and hf_usage is not None, prompt
        assert (vllm_usage.prompt_tokens, vllm_usage.completion_tokens) == (
            hf_usage.prompt_tokens,
            hf_usage.completion_tokens,
        ), prompt
        # Only vllm has a prefix cache to count hits in; hf reports none.
        assert isinstance(vllm_usage.cached_tokens, int), prompt
        assert hf_usage.cached_tokens is None, prompt
