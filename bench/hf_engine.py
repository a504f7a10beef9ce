"""Prints the hf engine's figures on the demo model, beside plain ``PeftModel.generate``.

Run ``python -m bench.hf_engine [--build] [--tokens N] [--repeats R]``; nothing here
is asserted. Tokens per second are measured for the engine and for the simplest
baseline, ``PeftModel.generate(..., adapter_names=[...])`` on its own copy of the
same weights, interleaved batch by batch so all see the same machine load: the
same prompt, one row per request, base and adapters mixed, one model thread
with the same torch thread count, every row generating exactly ``--tokens``.

The demo model answers every prompt with eos within a few dozen greedy tokens,
and the engine has no switch to ignore eos, so the engine samples at a high
temperature with a seed that never meets eos (checked: a short row is an error).
``generate`` runs twice: greedy (less work per token than sampling) and sampled at
the same temperature, both with ``min_new_tokens`` so neither stops early.

Each figure comes twice: per second of wall time, and per second of this
process's CPU time (all threads). On a machine shared with other work the wall
figures swing with the load; the CPU figures barely move, so their ratio is
the steadier comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from lorafleet.launch.demo_model import (
    ADAPTER_NAMES,
    DEMO_MODEL_NAME,
    DemoModelPaths,
    build_demo_model,
    ensure_demo_model,
)
from lorafleet.proto.inference import FinalChunk, GenerateRequest, SamplingParams
from lorafleet.proto.naming import lora_id
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines._hf_batch import BASE_ADAPTER
from lorafleet.worker.engines.hf import HFEngine

BATCH_SIZES: Final = (1, 3, 6, 12)
PROMPT: Final = "hi"
TEMPERATURE: Final = 100.0
"""Near-uniform sampling: with ``RUN_TO_LENGTH_SEED`` the engine never draws eos."""
RUN_TO_LENGTH_SEED: Final = 2
"""Runs 400 tokens on this engine's sampler (a short row stops the bench: try ``--seed``)."""
CPU_THREADS: Final = 1
"""The engine's default ``cpu_threads``; the baseline runs with the same."""
WARMUP_TOKENS: Final = 8


async def _one(engine: HFEngine, model: str, tokens: int, seed: int, index: int) -> int:
    sampling = SamplingParams(max_tokens=tokens, temperature=TEMPERATURE, seed=seed)
    request = GenerateRequest(
        request_id=f"bench-{index}", model=model, prompt=PROMPT, sampling=sampling
    )
    async for chunk in engine.generate(request):
        if isinstance(chunk, FinalChunk):
            return chunk.usage.completion_tokens
    return 0


def _models(batch: int) -> list[str]:
    """Base, pirate, robot, base, ...: the model of each row of a batch."""
    models = [DEMO_MODEL_NAME, *ADAPTER_NAMES]
    return [models[i % len(models)] for i in range(batch)]


@dataclass(frozen=True)
class Rate:
    """Tokens generated per second of wall time and per second of the process's CPU time."""

    wall: float
    cpu: float


class _Clock:
    """Wall and process CPU seconds since it was made."""

    def __init__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def rate(self, generated: int) -> Rate:
        wall, cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu
        return Rate(wall=generated / wall, cpu=generated / cpu)


async def _engine_rate(engine: HFEngine, batch: int, tokens: int, seed: int) -> Rate:
    clock = _Clock()
    counts = await asyncio.gather(
        *(_one(engine, model, tokens, seed, i) for i, model in enumerate(_models(batch)))
    )
    rate = clock.rate(sum(counts))
    if sum(counts) != batch * tokens:
        raise SystemExit(f"engine rows ended early ({counts}): pick another --seed")
    return rate


class Baseline:
    """The demo model and both adapters in one PeftModel, decoded with ``generate``."""

    def __init__(self, demo: DemoModelPaths) -> None:
        torch.set_num_threads(CPU_THREADS)  # on the baseline's own thread, as the engine does
        self.tokenizer: Any = AutoTokenizer.from_pretrained(demo.base)
        base = AutoModelForCausalLM.from_pretrained(demo.base, dtype=torch.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            first, *rest = ADAPTER_NAMES
            self.model: Any = PeftModel.from_pretrained(
                base, str(demo.adapters[first]), adapter_name=first
            )
            for name in rest:
                self.model.load_adapter(str(demo.adapters[name]), adapter_name=name)
        self.model.eval()

    def rate(self, batch: int, tokens: int, sample: bool) -> Rate:
        """Generated tokens per second for ``batch`` rows of ``tokens`` tokens each."""
        clock = _Clock()
        ids = torch.tensor([self.tokenizer.encode(PROMPT)] * batch)
        names = [BASE_ADAPTER if m == DEMO_MODEL_NAME else m for m in _models(batch)]
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                adapter_names=names,
                do_sample=sample,
                temperature=TEMPERATURE if sample else None,
                top_k=0 if sample else None,
                top_p=1.0,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        return clock.rate((out.shape[1] - ids.shape[1]) * batch)


async def _bench(demo: DemoModelPaths, tokens: int, repeats: int, seed: int) -> None:
    started = time.monotonic()
    config = EngineConfig(model=str(demo.base), served_model_name=DEMO_MODEL_NAME, enable_lora=True)
    engine = HFEngine(config)
    await engine.start()
    print(f"engine start: {time.monotonic() - started:.2f} s")
    for name in ADAPTER_NAMES:
        started = time.monotonic()
        await engine.add_adapter(name, lora_id(name), demo.adapters[name])
        print(f"adapter load ({name}): {time.monotonic() - started:.3f} s")
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="baseline") as thread:
        baseline = await loop.run_in_executor(thread, Baseline, demo)

        async def measure(batch: int, tokens: int) -> Rates:
            return Rates(
                engine=await _engine_rate(engine, batch, tokens, seed),
                greedy=await loop.run_in_executor(thread, baseline.rate, batch, tokens, False),
                sampled=await loop.run_in_executor(thread, baseline.rate, batch, tokens, True),
            )

        await measure(max(BATCH_SIZES), WARMUP_TOKENS)
        runs: dict[int, list[Rates]] = {b: [] for b in BATCH_SIZES}
        for _ in range(repeats):
            for batch in BATCH_SIZES:
                runs[batch].append(await measure(batch, tokens))
    await engine.stop()
    _report(runs, tokens)


@dataclass(frozen=True)
class Rates:
    """One batch size in one run: the engine, then ``generate`` greedy and sampled."""

    engine: Rate
    greedy: Rate
    sampled: Rate


def _report(runs: dict[int, list[Rates]], tokens: int) -> None:
    """Per clock, one line per batch size: medians over the runs, ratios of paired runs."""
    repeats = len(next(iter(runs.values())))
    print(f"{tokens} tokens per request, medians of {repeats} interleaved runs")
    for clock in ("wall", "cpu"):
        print(f"tokens per {clock} second")
        print("batch | engine | generate greedy | ratio | generate sampled | ratio")
        for batch, rates in runs.items():
            engine = [getattr(r.engine, clock) for r in rates]
            greedy = [getattr(r.greedy, clock) for r in rates]
            sampled = [getattr(r.sampled, clock) for r in rates]
            vs_greedy = statistics.median(e / g for e, g in zip(engine, greedy, strict=True))
            vs_sampled = statistics.median(e / s for e, s in zip(engine, sampled, strict=True))
            print(
                f"{batch:5d} | {statistics.median(engine):6.0f} "
                f"| {statistics.median(greedy):15.0f} | {vs_greedy:4.2f}x "
                f"| {statistics.median(sampled):16.0f} | {vs_sampled:4.2f}x"
            )


def main() -> None:
    """Measure and print; ``--build`` also times a fresh demo model build."""
    parser = argparse.ArgumentParser(prog="python -m bench.hf_engine", description=__doc__)
    parser.add_argument("--build", action="store_true", help="time a fresh build too")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per request")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per batch size")
    parser.add_argument("--seed", type=int, default=RUN_TO_LENGTH_SEED, help="the engine's seed")
    args = parser.parse_args()
    if args.build:
        with tempfile.TemporaryDirectory() as scratch:
            started = time.monotonic()
            build_demo_model(Path(scratch) / "demo")
            print(f"demo model build: {time.monotonic() - started:.1f} s")
    asyncio.run(_bench(ensure_demo_model(), args.tokens, args.repeats, args.seed))


if __name__ == "__main__":
    main()
