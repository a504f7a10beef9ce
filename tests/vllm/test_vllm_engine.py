"""The vllm engine on the demo model: each voice, streaming, sampling, cancelling, adapters."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lorafleet.launch.demo_model import DEMO_MODEL_NAME, EXPECTED, EXPECTED_PROMPT, DemoModelPaths
from lorafleet.proto.errors import InvalidRequestError, NotFoundError, UnavailableError
from lorafleet.proto.inference import GenerateRequest, SamplingParams
from lorafleet.proto.naming import lora_id
from tests.vllm.answers import answer, chat

VOICES = {"base": DEMO_MODEL_NAME, "pirate": "pirate", "robot": "robot"}


@pytest.mark.parametrize("persona", sorted(VOICES))
async def test_base_model_and_each_adapter_answer_in_their_own_voice(
    engine: Any, persona: str
) -> None:
    result = await answer(engine, chat(VOICES[persona], EXPECTED_PROMPT))
    assert result.text == EXPECTED[persona]
    assert result.final.finish_reason == "stop"


async def test_streamed_deltas_add_up_to_the_usage_reported_at_the_end(engine: Any) -> None:
    result = await answer(engine, chat("pirate", EXPECTED_PROMPT))
    assert len(result.chunks) > 1
    streamed = sum(chunk.tokens for chunk in result.chunks)
    assert result.final.usage.completion_tokens == streamed + 1  # the end token has no text
    assert result.final.usage.prompt_tokens > 0


async def test_max_tokens_cuts_the_answer_with_finish_reason_length(engine: Any) -> None:
    result = await answer(engine, chat("robot", EXPECTED_PROMPT, max_tokens=3))
    assert result.final.finish_reason == "length"
    assert result.final.usage.completion_tokens == 3
    assert sum(chunk.tokens for chunk in result.chunks) == 3
    assert EXPECTED["robot"].startswith(result.text)


async def test_stop_string_ends_the_answer_before_it(engine: Any) -> None:
    result = await answer(engine, chat("pirate", EXPECTED_PROMPT, stop=["!"]))
    assert result.text == EXPECTED["pirate"].split("!")[0]
    assert result.final.finish_reason == "stop"


async def test_same_seed_samples_the_same_answer(engine: Any) -> None:
    sampling = {"temperature": 1.5, "top_p": 0.95, "seed": 7, "max_tokens": 24}
    first = await answer(engine, chat(DEMO_MODEL_NAME, "Tell me a story.", **sampling))
    again = await answer(engine, chat(DEMO_MODEL_NAME, "Tell me a story.", **sampling))
    assert first.text == again.text


async def test_plain_prompt_is_completed_without_the_chat_template(engine: Any) -> None:
    request = GenerateRequest(
        request_id="plain-1",
        model=DEMO_MODEL_NAME,
        prompt="hello",
        sampling=SamplingParams(max_tokens=4, temperature=0.0),
    )
    result = await answer(engine, request)
    assert result.final.usage.prompt_tokens < 5
    assert result.final.usage.completion_tokens >= 1


async def test_unknown_model_is_not_found_and_names_what_is_served(engine: Any) -> None:
    with pytest.raises(NotFoundError, match=r"'chef'.*\['pirate', 'robot'\]"):
        await answer(engine, chat("chef", EXPECTED_PROMPT))


async def test_prompt_longer_than_the_context_is_an_invalid_request(engine: Any) -> None:
    with pytest.raises(InvalidRequestError, match="request"):
        await answer(engine, chat(DEMO_MODEL_NAME, "hello " * 600))
    assert engine.unfinished_requests() == 0


async def test_closing_the_stream_aborts_the_request_in_vllm(engine: Any) -> None:
    sampling = {"temperature": 2.0, "seed": 1, "max_tokens": 400}
    stream = engine.generate(chat("robot", "Count to a thousand, slowly.", **sampling))
    await anext(stream)
    await stream.aclose()
    for _ in range(100):
        if engine.unfinished_requests() == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.unfinished_requests() == 0


async def test_cancelling_the_consumer_aborts_the_request_in_vllm(engine: Any) -> None:
    sampling = {"temperature": 2.0, "seed": 2, "max_tokens": 400}
    task = asyncio.create_task(answer(engine, chat("pirate", "Sing forever.", **sampling)))
    while engine.unfinished_requests() == 0 and not task.done():
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    for _ in range(100):
        if engine.unfinished_requests() == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.unfinished_requests() == 0


async def test_removed_adapter_is_not_found_and_the_base_model_answers_as_before(
    engine: Any, demo: DemoModelPaths
) -> None:
    await engine.add_adapter("pirate-copy", lora_id("pirate-copy"), demo.adapters["pirate"])
    assert (await answer(engine, chat("pirate-copy", EXPECTED_PROMPT))).text == EXPECTED["pirate"]
    await engine.remove_adapter("pirate-copy")
    with pytest.raises(NotFoundError, match="pirate-copy"):
        await answer(engine, chat("pirate-copy", EXPECTED_PROMPT))
    assert lora_id("pirate-copy") not in await engine.vllm_lora_ids()
    assert (await answer(engine, chat(DEMO_MODEL_NAME, EXPECTED_PROMPT))).text == EXPECTED["base"]


async def test_a_request_still_running_on_a_removed_adapter_ends_with_the_unloaded_error(
    engine: Any, demo: DemoModelPaths
) -> None:
    """The LoRA controller drains first; vLLM aborts what still runs when the adapter is
    removed, and the stream ends with the error every engine gives (hf's and the mocker's)."""
    await engine.add_adapter("cut-copy", lora_id("cut-copy"), demo.adapters["pirate"])
    sampling = {"temperature": 2.0, "seed": 3, "max_tokens": 400}
    stream = engine.generate(chat("cut-copy", "Sing forever.", **sampling))
    await anext(stream)
    await engine.remove_adapter("cut-copy")
    with pytest.raises(UnavailableError, match=r"adapter 'cut-copy' was unloaded while request"):
        async for _ in stream:
            pass
    assert engine.unfinished_requests() == 0


async def test_adapter_without_files_is_an_invalid_request(engine: Any, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match=r"adapter_config\.json"):
        await engine.add_adapter("ghost", lora_id("ghost"), tmp_path)
    assert "ghost" not in engine.loaded_adapters()


async def test_base_card_reports_the_context_length_vllm_uses(engine: Any) -> None:
    card = engine.base_card()
    assert card.display_name == DEMO_MODEL_NAME
    assert card.context_length == 512
    assert card.runtime_config.max_loras == 3
