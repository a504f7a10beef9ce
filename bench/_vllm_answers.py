"""Greedy answers of lorafleet, ``vllm serve`` and the hf engine, compared per model and prompt.

Used by ``bench.vllm_serve``. When the two vLLM sides disagree, the hf engine's
answer (same weights, float32) names the side that is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from bench._http import http_once
from bench._report import table
from lorafleet.launch.demo_model import DEMO_MODEL_NAME, DemoModelPaths
from lorafleet.proto.inference import ChatMessage, FinalChunk, GenerateRequest, SamplingParams
from lorafleet.proto.naming import lora_id

__all__ = ["PROMPTS", "Answers", "answers_table", "hf_answers", "served_answers"]

PROMPTS: Final = ("Who are you?", "What do you like?", "Hello!")
Answers = dict[str, dict[str, str]]
"""Model → prompt → answer text."""


def chat_body(model: str, prompt: str, max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    """A greedy chat request (streamed with its usage when ``stream``)."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}],
                            "max_tokens": max_tokens, "temperature": 0.0}  # fmt: skip
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def served_answers(port: int, models: Sequence[str], max_tokens: int) -> Answers:
    """Every model's answer to every prompt from the OpenAI server on ``port``."""
    found: Answers = {}
    for model in models:
        for prompt in PROMPTS:
            body = chat_body(model, prompt, max_tokens)
            response = await http_once(port, "POST", "/v1/chat/completions", body)
            if response.status == 200:
                text = msgspec.json.decode(response.body)["choices"][0]["message"]["content"]
            else:
                text = f"HTTP {response.status}: {response.body[:200]!r}"
            found.setdefault(model, {})[prompt] = str(text)
    return found


async def hf_answers(demo: DemoModelPaths, models: Sequence[str], max_tokens: int) -> Answers:
    """The same answers from the hf engine, in this process."""
    from lorafleet.worker.engine import EngineConfig
    from lorafleet.worker.engines.hf import HFEngine

    config = EngineConfig(model=str(demo.base), served_model_name=DEMO_MODEL_NAME,
                          enable_lora=True, max_loras=len(models), max_lora_rank=8)  # fmt: skip
    engine = HFEngine(config)
    await engine.start()
    try:
        for model in models:
            if model != DEMO_MODEL_NAME:
                await engine.add_adapter(model, lora_id(model), demo.adapters[model])
        found: Answers = {}
        for index, (model, prompt) in enumerate((m, p) for m in models for p in PROMPTS):
            request = GenerateRequest(
                request_id=f"hf-{index}", model=model,
                messages=[ChatMessage(role="user", content=prompt)],
                sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
            )  # fmt: skip
            parts = [chunk.text async for chunk in engine.generate(request)
                     if not isinstance(chunk, FinalChunk)]  # fmt: skip
            found.setdefault(model, {})[prompt] = "".join(parts)
        return found
    finally:
        await engine.stop()


def _verdict(ours: str, serve: str, hf: str) -> str:
    if ours == serve:
        return "same" if ours == hf else "same, hf differs"
    if ours == hf:
        return "vllm serve wrong"
    return "lorafleet wrong" if serve == hf else "both differ from hf"


def answers_table(answers: dict[str, Answers]) -> dict[str, Any]:
    """Rows of (model, prompt, verdict, the three answers), counts, and a printable table."""
    rows = []
    for model, by_prompt in answers["lorafleet"].items():
        for prompt, ours in by_prompt.items():
            serve, hf = answers["vllm_serve"][model][prompt], answers["hf"][model][prompt]
            rows.append({"model": model, "prompt": prompt, "verdict": _verdict(ours, serve, hf),
                         "lorafleet": ours, "vllm_serve": serve, "hf": hf})  # fmt: skip
    identical = sum(row["lorafleet"] == row["vllm_serve"] for row in rows)
    cells = [[row["model"], row["prompt"], row["verdict"], row["lorafleet"]] for row in rows]
    lines = [
        f"{identical} of {len(rows)} greedy answers identical on both sides",
        table(["model", "prompt", "verdict", "lorafleet answer"], cells),
        *(_mismatch(row) for row in rows if row["verdict"] != "same"),
    ]
    return {"rows": rows, "identical": identical, "total": len(rows), "text": "\n".join(lines)}


def _mismatch(row: dict[str, str]) -> str:
    return (
        f"{row['model']} / {row['prompt']}: lorafleet {row['lorafleet']!r}, "
        f"vllm serve {row['vllm_serve']!r}, hf {row['hf']!r}"
    )
