"""The mocker engine's answer lengths: eos held back or ignored as asked, bias refused."""

from __future__ import annotations

import asyncio

import pytest

from lorafleet.proto.errors import InvalidRequestError
from lorafleet.proto.inference import FinalChunk, GenerateRequest, SamplingParams
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines.mocker import MockerEngine

NATURAL_TOKENS = 5


async def _answer(**sampling: object) -> FinalChunk:
    engine = MockerEngine(EngineConfig(model="m", options={"output_tokens": NATURAL_TOKENS}))
    request = GenerateRequest(
        request_id="r", model="m", prompt="hi", sampling=SamplingParams(**sampling)
    )
    chunks = [chunk async for chunk in engine.generate(request)]
    final = chunks[-1]
    assert isinstance(final, FinalChunk)
    assert len(chunks) - 1 == final.usage.completion_tokens
    return final


@pytest.mark.parametrize(
    ("sampling", "tokens", "reason"),
    [
        ({"max_tokens": 16}, NATURAL_TOKENS, "stop"),
        ({"max_tokens": 3}, 3, "length"),
        ({"max_tokens": 16, "ignore_eos": True}, 16, "length"),
        ({"max_tokens": 16, "min_tokens": 9}, 9, "stop"),
    ],
)
async def test_the_answer_has_exactly_the_asked_length(
    sampling: dict[str, object], tokens: int, reason: str
) -> None:
    final = await _answer(**sampling)
    assert (final.usage.completion_tokens, final.finish_reason) == (tokens, reason)


async def test_logit_bias_is_refused_naming_it() -> None:
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        await _answer(logit_bias={1: 5.0})


async def test_past_max_running_a_request_waits_for_a_running_one_to_end() -> None:
    engine = MockerEngine(EngineConfig(model="m", options={"max_running": 1, "output_tokens": 3}))

    def request(request_id: str) -> GenerateRequest:
        return GenerateRequest(request_id=request_id, model="m", prompt="hi",
                               sampling=SamplingParams(max_tokens=8))  # fmt: skip

    first, second = engine.generate(request("a")), engine.generate(request("b"))
    await anext(first)  # "a" runs, holding the one place
    waiting = asyncio.create_task(anext(second))
    for _ in range(20):  # let the loop run "b" as far as it can go
        await asyncio.sleep(0)
    assert not waiting.done()
    assert len([chunk async for chunk in first]) == 3  # two tokens and the final chunk
    assert (await waiting).token_ids == [0]  # "a" ended: "b" got its place
    await second.aclose()
