"""Tests for the hf engine on the demo model: answers, mixed-adapter batches, limits, cancelling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest
import pytest_asyncio

from lorafleet.launch._demo_corpus import ANSWERS, chat_prompt
from lorafleet.launch.demo_model import (
    ADAPTER_NAMES,
    DEMO_MODEL_NAME,
    EXPECTED,
    EXPECTED_PROMPT,
    DemoModelPaths,
)
from lorafleet.proto.errors import InvalidRequestError, NotFoundError, UnavailableError
from lorafleet.proto.inference import (
    ChatMessage,
    FinalChunk,
    GenerateRequest,
    SamplingParams,
    TokenChunk,
)
from lorafleet.proto.naming import lora_id
from lorafleet.worker.base_model_check import BaseModelCheck
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines.hf import HFEngine

PERSONAS: Final = {"base": DEMO_MODEL_NAME, "pirate": "pirate", "robot": "robot"}
# Near-uniform sampling that, with this seed, runs to max_tokens without an eos
# (checked on torch 2.13 CPU, for every persona); if another build ends it early
# the tests below still pass, they only prove less.
LONG: Final = SamplingParams(max_tokens=400, temperature=100.0, seed=2)


@contextlib.asynccontextmanager
async def started(demo: DemoModelPaths, *adapters: str, **config: Any) -> AsyncIterator[HFEngine]:
    """A running engine on the demo model with ``adapters`` loaded."""
    options = config.pop("options", {})
    engine = HFEngine(
        EngineConfig(
            model=str(demo.base),
            served_model_name=DEMO_MODEL_NAME,
            enable_lora=True,
            **{"max_loras": 2, **config},
            options=options,
        )
    )
    await engine.start()
    try:
        for name in adapters:
            await engine.add_adapter(name, lora_id(name), demo.adapters[name])
        yield engine
    finally:
        await engine.stop()


@pytest_asyncio.fixture(scope="module")
async def engine(demo: DemoModelPaths) -> AsyncIterator[HFEngine]:
    """One shared engine with both demo adapters, for tests that do not change it."""
    async with started(demo, *ADAPTER_NAMES) as shared:
        yield shared


def chat(model: str, text: str = EXPECTED_PROMPT, **sampling: Any) -> GenerateRequest:
    params = SamplingParams(**{"max_tokens": 64, "temperature": 0.0, **sampling})
    messages = [ChatMessage(role="user", content=text)]
    return GenerateRequest(
        request_id=f"{model}-{text}", model=model, messages=messages, sampling=params
    )


async def answer(engine: HFEngine, request: GenerateRequest) -> tuple[str, FinalChunk]:
    """The whole streamed text and the final chunk."""
    chunks = [chunk async for chunk in engine.generate(request)]
    final = chunks.pop()
    assert isinstance(final, FinalChunk)
    assert all(isinstance(c, TokenChunk) for c in chunks)
    return "".join(c.text for c in chunks if isinstance(c, TokenChunk)), final


@pytest.mark.parametrize("persona", PERSONAS)
async def test_each_model_answers_in_its_own_voice(engine: HFEngine, persona: str) -> None:
    text, final = await answer(engine, chat(PERSONAS[persona]))
    assert text == EXPECTED[persona]
    assert final.finish_reason == "stop"


async def test_base_and_adapters_in_one_batch_answer_as_alone(engine: HFEngine) -> None:
    models = [*PERSONAS.values(), *reversed(PERSONAS.values())]
    results = await asyncio.gather(*(answer(engine, chat(m)) for m in models))
    texts = [text for text, _ in results]
    assert texts == [EXPECTED[p] for p in [*PERSONAS, *reversed(PERSONAS)]]
    assert engine.stats()["peak_batch"] >= len(models)  # they really shared a step


async def test_prompts_of_every_length_in_one_batch_answer_as_alone(engine: HFEngine) -> None:
    # Left-padded rows that end at different steps: the batch pads, trims and unpads.
    asked = [(prompt, persona) for prompt in ANSWERS for persona in PERSONAS]
    results = await asyncio.gather(*(answer(engine, chat(PERSONAS[p], q)) for q, p in asked))
    assert [text for text, _ in results] == [ANSWERS[q][p] for q, p in asked]
    assert engine.stats()["peak_batch"] >= len(asked)


async def test_requests_joining_a_running_batch_answer_as_alone(engine: HFEngine) -> None:
    stream = engine.generate(chat(DEMO_MODEL_NAME))
    first = await anext(stream)
    joiners = asyncio.gather(answer(engine, chat("pirate")), answer(engine, chat("robot")))
    rest = [chunk async for chunk in stream]
    base_text = first.text + "".join(c.text for c in rest if isinstance(c, TokenChunk))
    assert base_text == EXPECTED["base"]
    assert [text for text, _ in await joiners] == [EXPECTED["pirate"], EXPECTED["robot"]]


async def test_usage_counts_prompt_and_completion_tokens(engine: HFEngine) -> None:
    tokenizer = engine._host.tokenizer  # type: ignore[union-attr]
    _, final = await answer(engine, chat("robot"))
    assert final.usage.prompt_tokens == len(tokenizer.encode(chat_prompt(EXPECTED_PROMPT)))
    # The answer's tokens and the eos that ended it.
    assert final.usage.completion_tokens == len(tokenizer.encode(EXPECTED["robot"])) + 1


async def test_max_tokens_ends_the_answer_with_length(engine: HFEngine) -> None:
    text, final = await answer(engine, chat("pirate", max_tokens=3))
    assert final.finish_reason == "length"
    assert final.usage.completion_tokens == 3
    assert text and EXPECTED["pirate"].startswith(text)


async def test_stop_string_cuts_the_answer_before_it(engine: HFEngine) -> None:
    text, final = await answer(engine, chat(DEMO_MODEL_NAME, stop=["tiny", "zzz"]))
    assert text == EXPECTED["base"][: EXPECTED["base"].index("tiny")]
    assert final.finish_reason == "stop"


async def test_stop_string_usage_counts_the_tokens_up_to_the_stop(engine: HFEngine) -> None:
    # Up to the token that completes the stop string, not any the model thread ran ahead to.
    tokenizer = engine._host.tokenizer  # type: ignore[union-attr]
    _, final = await answer(engine, chat(DEMO_MODEL_NAME, stop=["tiny"]))
    ids = tokenizer.encode(EXPECTED["base"])
    upto = next(k for k in range(1, len(ids) + 1) if "tiny" in tokenizer.decode(ids[:k]))
    assert final.usage.completion_tokens == upto


async def test_prompt_request_is_raw_text(engine: HFEngine) -> None:
    request = GenerateRequest(
        request_id="raw",
        model="robot",
        prompt=chat_prompt(EXPECTED_PROMPT),
        sampling=SamplingParams(max_tokens=64, temperature=0.0),
    )
    text, _ = await answer(engine, request)
    assert text == EXPECTED["robot"]


async def test_same_seed_samples_the_same_text(engine: HFEngine) -> None:
    request = chat("pirate", "Tell me a joke.", temperature=1.5, top_p=0.9, seed=11)
    first, second = await asyncio.gather(answer(engine, request), answer(engine, request))
    assert first[0] == second[0]


async def test_unknown_model_is_not_found(engine: HFEngine) -> None:
    with pytest.raises(NotFoundError, match=r"'ninja'.*pirate"):
        await answer(engine, chat("ninja"))


async def test_removed_adapter_is_not_found_and_base_answers_as_before(
    demo: DemoModelPaths,
) -> None:
    async with started(demo, "pirate", "robot") as fresh:
        await fresh.remove_adapter("pirate")
        with pytest.raises(NotFoundError, match="pirate"):
            await answer(fresh, chat("pirate"))
        assert (await answer(fresh, chat(DEMO_MODEL_NAME)))[0] == EXPECTED["base"]
        assert (await answer(fresh, chat("robot")))[0] == EXPECTED["robot"]
        await fresh.remove_adapter("robot")  # the last one: the base model is unwrapped
        assert (await answer(fresh, chat(DEMO_MODEL_NAME)))[0] == EXPECTED["base"]
        await fresh.add_adapter("pirate", lora_id("pirate"), demo.adapters["pirate"])
        assert (await answer(fresh, chat("pirate")))[0] == EXPECTED["pirate"]
        assert fresh.loaded_adapters() == {"pirate": lora_id("pirate")}


async def test_adapter_above_max_lora_rank_is_refused(demo: DemoModelPaths) -> None:
    async with started(demo, max_lora_rank=4) as fresh:
        with pytest.raises(InvalidRequestError, match="rank 8"):
            await fresh.add_adapter("pirate", lora_id("pirate"), demo.adapters["pirate"])
        assert fresh.loaded_adapters() == {}


async def test_cancelled_request_frees_its_slot(demo: DemoModelPaths) -> None:
    async with started(demo, options={"max_batch_size": 1}) as fresh:
        long = GenerateRequest(request_id="long", model=DEMO_MODEL_NAME, prompt="hi", sampling=LONG)
        stream = fresh.generate(long)
        assert isinstance(await anext(stream), TokenChunk)
        consumer = asyncio.create_task(answer(fresh, chat(DEMO_MODEL_NAME)))
        await stream.aclose()  # the caller went away
        assert (await consumer)[0] == EXPECTED["base"]
        # Had the long request kept its only slot, it would have run 400 tokens first.
        assert fresh.stats()["tokens_generated"] < 100
        assert fresh.stats()["running"] == 0


async def test_cancelled_consumer_task_frees_its_slot(demo: DemoModelPaths) -> None:
    async with started(demo, options={"max_batch_size": 1}) as fresh:
        long = GenerateRequest(request_id="long", model=DEMO_MODEL_NAME, prompt="hi", sampling=LONG)
        first_token = asyncio.Event()

        async def consume() -> None:
            async for _ in fresh.generate(long):
                first_token.set()

        task = asyncio.create_task(consume())
        await first_token.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await answer(fresh, chat(DEMO_MODEL_NAME)))[0] == EXPECTED["base"]
        assert fresh.stats()["tokens_generated"] < 100


async def test_unloading_an_adapter_ends_its_requests_in_flight(demo: DemoModelPaths) -> None:
    async with started(demo, "pirate") as fresh:
        long = GenerateRequest(request_id="long", model="pirate", prompt="hi", sampling=LONG)
        stream = fresh.generate(long)
        await anext(stream)
        await fresh.remove_adapter("pirate")
        with pytest.raises(UnavailableError, match="pirate"):
            async for _ in stream:
                pass
        assert (await answer(fresh, chat(DEMO_MODEL_NAME)))[0] == EXPECTED["base"]


async def test_stopped_engine_refuses_requests(demo: DemoModelPaths) -> None:
    async with started(demo) as fresh:
        pass
    with pytest.raises(UnavailableError):
        await answer(fresh, chat(DEMO_MODEL_NAME))


def _changed_adapter(demo: DemoModelPaths, into: Path, **config: Any) -> Path:
    """A copy of the demo's pirate adapter with ``config`` changed in ``adapter_config.json``."""
    shutil.copytree(demo.adapters["pirate"], into)
    written = json.loads((into / "adapter_config.json").read_text())
    (into / "adapter_config.json").write_text(json.dumps({**written, **config}))
    return into


async def test_an_adapter_whose_modules_or_shapes_do_not_fit_is_a_400_naming_the_module(
    demo: DemoModelPaths, tmp_path: Path
) -> None:
    """Whatever DYN_LORA_BASE_MODEL_CHECK says: peft refuses, and the engine says so as a 400."""
    missing = _changed_adapter(demo, tmp_path / "missing", target_modules=["no_such_proj"])
    misshapen = _changed_adapter(demo, tmp_path / "misshapen", r=4)  # the weights are rank 8
    async with started(demo) as fresh:
        with pytest.raises(InvalidRequestError, match=r"no_such_proj.*not found in the base model"):
            await fresh.add_adapter("missing", lora_id("missing"), missing)
        with pytest.raises(InvalidRequestError, match=r"size mismatch for .*q_proj\.lora_A"):
            await fresh.add_adapter("misshapen", lora_id("misshapen"), misshapen)
        await fresh.add_adapter("pirate", lora_id("pirate"), demo.adapters["pirate"])
        assert set(fresh.loaded_adapters()) == {"pirate"}


def test_the_demo_adapters_match_the_demo_base_model_by_its_hub_id(demo: DemoModelPaths) -> None:
    engine = HFEngine(EngineConfig(model=str(demo.base), served_model_name=DEMO_MODEL_NAME,
                                   base_model_check=BaseModelCheck.STRICT))  # fmt: skip
    policy = engine.base_model_policy()
    assert all(policy.check(name, path) == [] for name, path in demo.adapters.items())
