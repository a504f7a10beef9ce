"""The hf engine's LoRA layers answer as peft's own ``generate(..., adapter_names=...)`` does.

The engine runs plain LoRA linear layers itself and leaves every other kind of
LoRA layer to peft: an adapter that also adapts the embeddings takes both paths.
"""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import Any, Final

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from lorafleet.launch._demo_corpus import chat_prompt
from lorafleet.launch.demo_model import DEMO_MODEL_NAME, EXPECTED_PROMPT, DemoModelPaths
from lorafleet.proto.inference import GenerateRequest, SamplingParams, TokenChunk
from lorafleet.proto.naming import lora_id
from lorafleet.worker.engines._hf_batch import BASE_ADAPTER
from lorafleet.worker.engines.hf import HFEngine
from tests.worker.engines.test_hf import started

pytestmark = pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")

TOKENS: Final = 24
EMBEDDING_ADAPTER: Final = "embedded"


def _embedding_adapter(demo: DemoModelPaths, into: Path) -> Path:
    """A random adapter of the demo model's embeddings and attention projections."""
    torch.manual_seed(7)
    base = AutoModelForCausalLM.from_pretrained(demo.base, dtype=torch.float32)
    config = LoraConfig(
        r=4, target_modules=["embed_tokens", "q_proj", "v_proj"], init_lora_weights=False
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the embeddings are tied to the output layer
        get_peft_model(base, config).save_pretrained(into)
    return into


def _generate(demo: DemoModelPaths, adapters: dict[str, Path], names: list[str]) -> list[list[int]]:
    """Each row's greedy tokens from ``PeftModel.generate``, up to its first eos."""
    tokenizer: Any = AutoTokenizer.from_pretrained(demo.base)
    base = AutoModelForCausalLM.from_pretrained(demo.base, dtype=torch.float32)
    (first, path), *rest = adapters.items()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model: Any = PeftModel.from_pretrained(base, str(path), adapter_name=first)
        for name, other in rest:
            model.load_adapter(str(other), adapter_name=name)
    ids = torch.tensor([tokenizer.encode(chat_prompt(EXPECTED_PROMPT))] * len(names))
    with torch.inference_mode():
        out = model.eval().generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            adapter_names=names,
            do_sample=False,
            max_new_tokens=TOKENS,
            pad_token_id=tokenizer.pad_token_id,
        )
    rows = out[:, ids.shape[1] :].tolist()
    return [row[: row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row
            for row in rows]  # fmt: skip


async def _engine_ids(engine: HFEngine, model: str) -> list[int]:
    request = GenerateRequest(
        request_id=f"lora-{model}",
        model=model,
        prompt=chat_prompt(EXPECTED_PROMPT),
        sampling=SamplingParams(max_tokens=TOKENS, temperature=0.0),
    )
    return [
        i async for c in engine.generate(request) if isinstance(c, TokenChunk) for i in c.token_ids
    ]


async def test_mixed_batch_answers_as_peft_generate_with_embedding_lora(
    demo: DemoModelPaths, tmp_path: Path
) -> None:
    adapters = {"pirate": demo.adapters["pirate"]}
    adapters[EMBEDDING_ADAPTER] = _embedding_adapter(demo, tmp_path / EMBEDDING_ADAPTER)
    models = [DEMO_MODEL_NAME, "pirate", EMBEDDING_ADAPTER, EMBEDDING_ADAPTER, DEMO_MODEL_NAME]
    names = [BASE_ADAPTER if m == DEMO_MODEL_NAME else m for m in models]
    expected = _generate(demo, adapters, names)
    async with started(demo) as engine:
        for name, path in adapters.items():
            await engine.add_adapter(name, lora_id(name), path)
        got = await asyncio.gather(*(_engine_ids(engine, m) for m in models))
        assert engine.stats()["peak_batch"] >= len(models)  # they shared steps
    assert got == expected
    assert expected[2] != expected[0]  # the embedding adapter does change the answer
