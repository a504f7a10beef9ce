"""Prints the hf engine's figures on the demo model: build, start, adapter load, tokens per second.

Run ``python -m bench.hf_engine [--build] [--tokens N]``; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Final

from launch.demo_model import (
    ADAPTER_NAMES,
    DEMO_MODEL_NAME,
    DemoModelPaths,
    build_demo_model,
    ensure_demo_model,
)
from proto.inference import FinalChunk, GenerateRequest, SamplingParams
from proto.naming import lora_id
from worker.engine import EngineConfig
from worker.engines.hf import HFEngine

BATCH_SIZES: Final = (1, 3, 6, 12)
# Near-uniform sampling with a seed that never meets eos, so every request runs its full length.
_RUN_TO_LENGTH_SEED: Final = 5


async def _one(engine: HFEngine, model: str, tokens: int, index: int) -> int:
    sampling = SamplingParams(max_tokens=tokens, temperature=100.0, seed=_RUN_TO_LENGTH_SEED)
    request = GenerateRequest(
        request_id=f"bench-{index}", model=model, prompt="hi", sampling=sampling
    )
    async for chunk in engine.generate(request):
        if isinstance(chunk, FinalChunk):
            return chunk.usage.completion_tokens
    return 0


async def _throughput(engine: HFEngine, batch: int, tokens: int) -> float:
    models = [DEMO_MODEL_NAME, *ADAPTER_NAMES]
    started = time.monotonic()
    counts = await asyncio.gather(
        *(_one(engine, models[i % len(models)], tokens, i) for i in range(batch))
    )
    return sum(counts) / (time.monotonic() - started)


async def _bench(demo: DemoModelPaths, tokens: int) -> None:
    started = time.monotonic()
    config = EngineConfig(model=str(demo.base), served_model_name=DEMO_MODEL_NAME, enable_lora=True)
    engine = HFEngine(config)
    await engine.start()
    print(f"engine start: {time.monotonic() - started:.2f} s")
    for name in ADAPTER_NAMES:
        started = time.monotonic()
        await engine.add_adapter(name, lora_id(name), demo.adapters[name])
        print(f"adapter load ({name}): {time.monotonic() - started:.3f} s")
    await _throughput(engine, 1, 8)  # warm-up
    for batch in BATCH_SIZES:
        rate = await _throughput(engine, batch, tokens)
        print(f"batch {batch:2d} (base+pirate+robot mixed): {rate:7.1f} tokens/s")
    await engine.stop()


def main() -> None:
    """Measure and print; ``--build`` also times a fresh demo model build."""
    parser = argparse.ArgumentParser(prog="python -m bench.hf_engine", description=__doc__)
    parser.add_argument("--build", action="store_true", help="time a fresh build too")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per request")
    args = parser.parse_args()
    if args.build:
        with tempfile.TemporaryDirectory() as scratch:
            started = time.monotonic()
            build_demo_model(Path(scratch) / "demo")
            print(f"demo model build: {time.monotonic() - started:.1f} s")
    asyncio.run(_bench(ensure_demo_model(), args.tokens))


if __name__ == "__main__":
    main()
