"""Engine implementations: mocker, hf (transformers + peft) and vllm.

Engines are imported on demand so that a mocker worker never loads torch.
"""

from __future__ import annotations

from typing import Final

from lorafleet.worker.engine import EngineConfig, LLMEngine

__all__ = ["ENGINE_KINDS", "create_engine"]

ENGINE_KINDS: Final = ("mocker", "hf", "vllm")


def create_engine(kind: str, config: EngineConfig) -> LLMEngine:
    """Build the engine named ``kind``; its heavy imports happen only here."""
    if kind == "mocker":
        from lorafleet.worker.engines.mocker import MockerEngine

        return MockerEngine(config)
    if kind == "hf":
        from lorafleet.worker.engines.hf import HFEngine

        return HFEngine(config)
    if kind == "vllm":
        from lorafleet.worker.engines.vllm import VLLMEngine

        return VLLMEngine(config)
    raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
