"""The mocker's KV cache seen from its requests: hits counted as vLLM counts them, a chat's
next turn reusing the whole conversation, salts and adapter versions kept apart."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from prometheus_client import REGISTRY

from lorafleet.fleet.kv_blocks import block_hashes, version_key, words_tokens
from lorafleet.proto.inference import ChatMessage, GenerateRequest, SamplingParams, TokenChunk
from lorafleet.proto.kv_events import BlocksStored, KvCacheSpec, KvEvent, VersionCleared
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines.mocker import MockerEngine
from tests.worker.adapters import make_adapter_dir

LONG = " ".join(f"w{i}" for i in range(40))  # 40 tokens: two whole blocks of 16


def _engine(model: str, **options: object) -> tuple[MockerEngine, list[KvEvent]]:
    engine = MockerEngine(EngineConfig(model=model, options={"output_tokens": 4, **options}))
    events: list[KvEvent] = []
    engine.publish_kv_events(events.append)
    return engine, events


async def _answer(engine: MockerEngine, request: GenerateRequest) -> str:
    chunks = [chunk async for chunk in engine.generate(request)]
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))


def _counted(model: str) -> tuple[float | None, float | None]:
    labels = {"model_name": model, "lora_name": ""}
    return (
        REGISTRY.get_sample_value("vllm:prefix_cache_queries_total", labels),
        REGISTRY.get_sample_value("vllm:prefix_cache_hits_total", labels),
    )


async def test_the_same_prompt_twice_hits_its_whole_blocks_in_vllms_counters() -> None:
    engine, events = _engine("kv-twice")
    for request_id in ("a", "b"):
        await _answer(engine, GenerateRequest(request_id=request_id, model="kv-twice", prompt=LONG))
    assert _counted("kv-twice") == (80, 32)
    expected = block_hashes(words_tokens([LONG]), 16, "kv-twice")
    assert events[0] == BlocksStored(version="kv-twice", hashes=expected)
    assert engine.kv_cache_spec() == KvCacheSpec(block_size=16, num_blocks=2048)


async def test_a_chats_next_turn_finds_the_previous_turn_and_its_answer_cached() -> None:
    engine, _ = _engine("kv-chat", output_tokens=30)
    turn = [ChatMessage(role="user", content=LONG)]
    first = GenerateRequest(request_id="1", model="kv-chat", messages=turn,
                            sampling=SamplingParams(max_tokens=30))  # fmt: skip
    answer = await _answer(engine, first)
    turn += [ChatMessage(role="assistant", content=answer), ChatMessage(role="user", content="ok")]
    await _answer(engine, GenerateRequest(request_id="2", model="kv-chat", messages=turn))
    assert _counted("kv-chat") == (40 + 71, 64)  # 40 + 30 + 1 words: 4 whole blocks cached


async def test_another_cache_salt_finds_nothing_cached() -> None:
    engine, _ = _engine("kv-salt")
    for salt in ("tenant-a", "tenant-b"):
        request = GenerateRequest(request_id=salt, model="kv-salt", prompt=LONG, cache_salt=salt)
        await _answer(engine, request)
    assert _counted("kv-salt") == (80, 0)


async def test_removing_an_adapter_clears_its_blocks(
    tmp_path: Path,
) -> None:
    engine, events = _engine("kv-base")
    await engine.add_adapter("pirate", 1, make_adapter_dir(tmp_path, "pirate"))
    await _answer(engine, GenerateRequest(request_id="r", model="pirate", prompt=LONG))
    await engine.remove_adapter("pirate")
    assert [type(event) for event in events] == [BlocksStored, VersionCleared]
    assert events[-1] == VersionCleared(version=version_key("pirate"))


async def test_no_cache_means_no_events_and_no_spec() -> None:
    engine, events = _engine("kv-off", kv_cache_blocks=0)
    await _answer(engine, GenerateRequest(request_id="r", model="kv-off", prompt=LONG))
    assert (events, engine.kv_cache_spec(), _counted("kv-off")) == ([], None, (40, 0))


async def test_prefills_run_one_at_a_time_and_a_cached_prompt_costs_none() -> None:
    """At 1,000 s per uncached token, only a prompt whose every block is cached can answer:
    the second one does, once the first one's prefill (cancelled) lets it in."""
    engine, _ = _engine("kv-serial", prefill_time_per_token_s=1000.0)
    whole_blocks = " ".join(f"w{i}" for i in range(32))
    first = engine.generate(GenerateRequest(request_id="a", model="kv-serial", prompt=whole_blocks))
    second = engine.generate(
        GenerateRequest(request_id="b", model="kv-serial", prompt=whole_blocks)
    )
    prefilling = asyncio.create_task(anext(first))
    waiting = asyncio.create_task(anext(second))
    for _ in range(20):  # let the loop run both as far as they can go
        await asyncio.sleep(0)
    assert not prefilling.done() and not waiting.done()  # "b" waits behind "a"'s prefill
    prefilling.cancel()  # the generator ends with it, its blocks stay cached
    with contextlib.suppress(asyncio.CancelledError):
        await prefilling
    token = await asyncio.wait_for(waiting, 30)
    assert isinstance(token, TokenChunk)
    await second.aclose()
