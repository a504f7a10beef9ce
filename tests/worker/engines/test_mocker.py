"""The mocker engine's answer lengths: eos held back or ignored as asked, bias refused."""

from __future__ import annotations

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
