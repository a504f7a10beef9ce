"""The hf engine continues an answer after given token ids exactly as if it had never stopped.

Stream migration sends another instance the ids a lost one already streamed
(``GenerateRequest.generated_ids``). With greedy decoding the continuation's
text must complete the answer exactly, at every point a stream can break
(between two chunks), with stop strings held back across the break too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio

from lorafleet.launch.demo_model import ADAPTER_NAMES, DemoModelPaths
from lorafleet.proto.inference import FinalChunk, GenerateRequest, TokenChunk
from lorafleet.worker.engines.hf import HFEngine
from tests.worker.engines.test_hf import PERSONAS, chat, started

pytestmark = pytest.mark.slow


@pytest_asyncio.fixture(scope="module")
async def engine(demo: DemoModelPaths) -> AsyncIterator[HFEngine]:
    async with started(demo, *ADAPTER_NAMES) as shared:
        yield shared


async def collect(engine: HFEngine, request: GenerateRequest) -> list[TokenChunk | FinalChunk]:
    return [chunk async for chunk in engine.generate(request)]


def _resumed(request: GenerateRequest, ids: list[int]) -> GenerateRequest:
    """``request`` as a frontend migrates it after the client received ``ids``."""
    left = request.sampling.max_tokens - len(ids)
    sampling = msgspec.structs.replace(request.sampling, max_tokens=left)
    return msgspec.structs.replace(request, generated_ids=ids, sampling=sampling)


async def _check_every_break(engine: HFEngine, request: GenerateRequest) -> None:
    chunks = await collect(engine, request)
    tokens = [c for c in chunks if isinstance(c, TokenChunk)]
    final = chunks[-1]
    assert isinstance(final, FinalChunk) and len(tokens) > 2
    assert all(len(c.token_ids) == c.tokens for c in tokens)
    for cut in range(1, len(tokens) + 1):
        ids = [i for c in tokens[:cut] for i in c.token_ids]
        rest = await collect(engine, _resumed(request, ids))
        rest_final = rest[-1]
        assert isinstance(rest_final, FinalChunk)
        text = "".join(c.text for c in tokens[:cut] + rest[:-1] if isinstance(c, TokenChunk))
        assert text == "".join(c.text for c in tokens), f"broken after chunk {cut}"
        assert rest_final.finish_reason == final.finish_reason
        assert rest_final.usage.prompt_tokens == final.usage.prompt_tokens
        assert rest_final.usage.completion_tokens == final.usage.completion_tokens - len(ids)


@pytest.mark.parametrize("persona", sorted(PERSONAS))
async def test_greedy_continuation_completes_the_answer_exactly(
    engine: HFEngine, persona: str
) -> None:
    await _check_every_break(engine, chat(PERSONAS[persona]))


async def test_continuation_keeps_a_stop_string_held_back_across_the_break(
    engine: HFEngine,
) -> None:
    # "hello! i am a tiny model.": the "a" of "a t" is held back after " a", then cut.
    await _check_every_break(engine, chat(PERSONAS["base"], stop=["a t"]))


async def test_continuation_that_hits_max_tokens_ends_with_length(engine: HFEngine) -> None:
    await _check_every_break(engine, chat(PERSONAS["pirate"], max_tokens=6))


async def test_continuation_with_no_budget_left_ends_at_once(engine: HFEngine) -> None:
    request = chat(PERSONAS["robot"], max_tokens=5)
    whole = await collect(engine, request)
    ids = [i for c in whole if isinstance(c, TokenChunk) for i in c.token_ids]
    (final,) = await collect(engine, _resumed(request, ids))
    assert isinstance(final, FinalChunk) and final.finish_reason == "length"
    assert final.usage.completion_tokens == 0
    assert final.usage.prompt_tokens == whole[-1].usage.prompt_tokens
