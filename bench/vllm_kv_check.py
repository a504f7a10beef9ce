"""Checks the vllm engine's KV events end to end: the same long prompt twice, base and adapter.

Run where vLLM runs (a GPU machine, or the vLLM venv on CPU)::

    python -m bench.vllm_kv_check --model PATH      # PATH: the demo model's folder (default)

It starts the engine with prefix caching and KV events on, sends one long prompt twice
to the base model and to the ``pirate`` adapter, and once more to the base model with a
``cache_salt``, and prints one JSON object: the relayed events, the prefix-cache counters,
and whether the relayed hashes are the fleet's hashes of the prompt's tokens under each
version and salt (what a frontend computes). Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Final

from lorafleet.fleet.kv_blocks import block_hashes, version_key
from lorafleet.launch.demo_model import DEMO_MODEL_NAME, ensure_demo_model
from lorafleet.proto.inference import FinalChunk, GenerateRequest, SamplingParams
from lorafleet.proto.kv_events import BlocksStored, KvEvent
from lorafleet.proto.naming import lora_id
from lorafleet.worker import metrics
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines.vllm import VLLMEngine

PROMPT: Final = " ".join(["Tell me a joke about the seven seas and a tiny robot."] * 12)
ADAPTER: Final = "pirate"
SALT: Final = "tenant-a"
SETTLE_S: Final = 1.0
"""vLLM publishes a step's events after the step; wait this long for the last ones."""


async def _ask(engine: VLLMEngine, model: str, request_id: str, salt: str = "") -> int:
    request = GenerateRequest(request_id=request_id, model=model, prompt=PROMPT, cache_salt=salt,
                              sampling=SamplingParams(max_tokens=4, temperature=0.0))  # fmt: skip
    async for chunk in engine.generate(request):
        if isinstance(chunk, FinalChunk):
            return chunk.usage.prompt_tokens
    return 0


def _expected(model_path: str, version: str, block_size: int, salt: str) -> list[int]:
    """The fleet's hashes of the prompt's whole blocks, from the model's own tokenizer."""
    from transformers import AutoTokenizer

    tokens = list(AutoTokenizer.from_pretrained(model_path).encode(PROMPT))
    return block_hashes(tokens, block_size, version, salt)


async def run(model: str, adapter_path: str | None) -> dict[str, Any]:
    """Start vLLM, ask twice per model, and report what the relay received."""
    events: list[KvEvent] = []
    engine = VLLMEngine(
        EngineConfig(model=model, served_model_name=DEMO_MODEL_NAME,
                     enable_lora=adapter_path is not None, max_loras=1, max_lora_rank=8,
                     context_length=512, options={"enforce_eager": True})
    )  # fmt: skip
    engine.publish_kv_events(events.append)
    await engine.start()
    try:
        models = [DEMO_MODEL_NAME]
        if adapter_path is not None:
            await engine.add_adapter(ADAPTER, lora_id(ADAPTER), Path(adapter_path))
            models.append(ADAPTER)
        prompt_tokens = {m: [await _ask(engine, m, f"{m}-{i}") for i in (1, 2)] for m in models}
        await _ask(engine, DEMO_MODEL_NAME, "salted", SALT)
        await asyncio.sleep(SETTLE_S)
        spec = engine.kv_cache_spec()
    finally:
        await engine.stop()
    queries, hits = metrics.prefix_cache_totals()
    block_size = spec.block_size if spec is not None else 16
    stored: dict[str, list[int]] = {}
    for event in events:
        if isinstance(event, BlocksStored):
            stored.setdefault(event.version, []).extend(event.hashes)
    cases = [(version_key(m), "") for m in models] + [(DEMO_MODEL_NAME, SALT)]
    checks = {
        f"{version} salt={salt!r}": set(want) <= set(stored.get(version, []))
        for version, salt in cases
        if (want := _expected(model, version, block_size, salt))
    }
    return {
        "kv_cache_spec": spec and {"block_size": spec.block_size, "num_blocks": spec.num_blocks},
        "prompt_tokens": prompt_tokens,
        "events": [
            f"{type(e).__name__} {e.version} {len(getattr(e, 'hashes', []))}" for e in events
        ],
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "hashes_match_the_fleets": checks,
        "ok": hits > 0 and bool(checks) and all(checks.values()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the model's folder (default: the demo model's base)")
    parser.add_argument("--adapter", help="a LoRA folder for the base (default: the demo's "
                        "pirate when --model is not given)")  # fmt: skip
    args = parser.parse_args(argv)
    model, adapter = args.model, args.adapter
    if model is None:
        demo = ensure_demo_model()
        model, adapter = str(demo.base), adapter or str(demo.adapters[ADAPTER])
    report = asyncio.run(run(model, adapter))
    print(json.dumps(report, indent=2))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
