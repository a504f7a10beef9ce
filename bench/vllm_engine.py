"""Prints the vllm engine's figures on the demo model: start-up, adapter load, tokens per second.

Run in the vLLM venv: ``VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind
.venv-vllm/bin/python -m bench.vllm_engine [--isolate auto|on|off]``. Prints one
JSON object; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any, Final

from lorafleet.launch.demo_model import ADAPTER_NAMES, DEMO_MODEL_NAME, ensure_demo_model
from lorafleet.proto.inference import ChatMessage, FinalChunk, GenerateRequest, SamplingParams
from lorafleet.proto.naming import lora_id
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines.vllm import VLLMEngine

MAX_TOKENS: Final = 64
ROUNDS: Final = 3
_ISOLATE: Final = {"auto": "auto", "on": True, "off": False}


def _request(model: str, index: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"bench-{index}",
        model=model,
        messages=[ChatMessage(role="user", content="Tell me a joke.")],
        sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
    )


async def _tokens(engine: VLLMEngine, request: GenerateRequest) -> int:
    async for chunk in engine.generate(request):
        if isinstance(chunk, FinalChunk):
            return chunk.usage.completion_tokens
    return 0


async def _tokens_per_s(engine: VLLMEngine, models: list[str]) -> float:
    """Completion tokens per second of ``models`` all in flight together, best of rounds."""
    best = 0.0
    for _ in range(ROUNDS):
        started = time.monotonic()
        counts = await asyncio.gather(
            *(_tokens(engine, _request(model, i)) for i, model in enumerate(models))
        )
        best = max(best, sum(counts) / (time.monotonic() - started))
    return round(best, 1)


async def run(isolate: str) -> dict[str, Any]:
    """Start the engine on the demo model, load both adapters, time a few workloads."""
    demo = await asyncio.to_thread(ensure_demo_model)
    options = {"enforce_eager": True, "max_num_seqs": 8, "isolate_base_rows": _ISOLATE[isolate]}
    engine = VLLMEngine(
        EngineConfig(model=str(demo.base), served_model_name=DEMO_MODEL_NAME, enable_lora=True,
                     max_loras=2, max_lora_rank=8, context_length=512, options=options)
    )  # fmt: skip
    await engine.start()
    load_s = {}
    for name in ADAPTER_NAMES:
        started = time.monotonic()
        await engine.add_adapter(name, lora_id(name), demo.adapters[name])
        load_s[name] = round(time.monotonic() - started, 3)
    figures = {
        "startup_s": round(engine.startup_s or 0.0, 1),
        "adapter_load_s": load_s,
        "isolate_base_rows": engine.isolates_base_rows,
        "mask_base_rows": engine.masks_base_rows,
        "tokens_per_s": {
            "base_1": await _tokens_per_s(engine, [DEMO_MODEL_NAME]),
            "pirate_1": await _tokens_per_s(engine, ["pirate"]),
            "pirate_4": await _tokens_per_s(engine, ["pirate"] * 4),
            "mixed_6": await _tokens_per_s(engine, [DEMO_MODEL_NAME, *ADAPTER_NAMES] * 2),
        },
    }
    await engine.stop()
    return figures


def main() -> None:
    """Command line entry: print the figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.vllm_engine", description=__doc__)
    parser.add_argument("--isolate", choices=sorted(_ISOLATE), default="auto")
    print(json.dumps(asyncio.run(run(parser.parse_args().isolate)), indent=2))


if __name__ == "__main__":
    main()
