"""The mocker engine: no weights, synthetic tokens at a set rate, a real adapter table.

It runs every worker and LoRA path without a model, and injects delays and
failures on request so that rollback and start-up failures are testable.
Its text names the model that produced it (``pirate:0 pirate:1 ...``), so a
test can tell whether the right adapter answered.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proto.errors import CapacityError, NotFoundError, UpstreamError
from proto.inference import FinalChunk, GenerateRequest, TokenChunk, Usage
from worker.adapter_engine import AdapterEngine
from worker.engine import EngineConfig, ModelEndpoint

__all__ = ["MockerEngine", "MockerOptions"]


@dataclass(frozen=True, kw_only=True)
class MockerOptions:
    """Knobs of the mocker, read from ``EngineConfig.options``.

    Examples::

        MockerOptions()                                  # instant tokens
        MockerOptions(time_per_token_s=0.01)             # 100 tokens/s per request
        MockerOptions(fail_add_adapter="broken.*")       # adding matching adapters fails
    """

    time_per_token_s: float = 0.0
    output_tokens: int = 64
    endpoint_ready_delay_s: float = 0.0
    fail_on_endpoint_ready: bool = False
    add_adapter_delay_s: float = 0.0
    fail_add_adapter: str = ""
    fail_remove_adapter: str = ""

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> MockerOptions:
        """Pick the mocker's keys out of the engine options (others are ignored)."""
        known = cls.__dataclass_fields__.keys()
        return cls(**{key: value for key, value in options.items() if key in known})


class MockerEngine(AdapterEngine):
    """Streams ``{model}:{i}`` tokens; adapters live in a table with ``max_loras`` slots."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.options = MockerOptions.from_options(dict(config.options))
        self.adapters: dict[str, int] = {}
        self.endpoint: ModelEndpoint | None = None

    async def on_endpoint_ready(self, endpoint: ModelEndpoint) -> None:
        """Keep the endpoint; optionally wait or fail, as a slow or broken engine would."""
        await asyncio.sleep(self.options.endpoint_ready_delay_s)
        if self.options.fail_on_endpoint_ready:
            raise UpstreamError("mocker: on_endpoint_ready failed as configured")
        self.endpoint = endpoint
        await super().on_endpoint_ready(endpoint)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | FinalChunk]:
        """Stream up to ``max_tokens`` synthetic tokens for the base model or a loaded adapter.

        Token ``i`` has id ``i``, so a continuation (``generated_ids``) resumes at the
        index after them, as a real engine resumes after its given tokens.
        """
        self._check_served(request.model)
        start = len(request.generated_ids)
        budget = max(0, min(request.sampling.max_tokens, self.options.output_tokens - start))
        for index in range(start, start + budget):
            await asyncio.sleep(self.options.time_per_token_s)
            yield TokenChunk(text=f"{request.model}:{index} ", token_ids=[index])
        finish = "length" if budget == request.sampling.max_tokens else "stop"
        yield FinalChunk(
            finish_reason=finish,
            usage=Usage(prompt_tokens=_prompt_words(request), completion_tokens=budget),
        )

    async def add_adapter(self, name: str, lora_id: int, path: Path) -> None:
        """Take a slot for ``name``; fails when all ``max_loras`` slots are taken."""
        await asyncio.sleep(self.options.add_adapter_delay_s)
        if self.options.fail_add_adapter and re.fullmatch(self.options.fail_add_adapter, name):
            raise UpstreamError(f"mocker: adding adapter {name!r} failed as configured")
        if name not in self.adapters and len(self.adapters) >= self.config.max_loras:
            raise CapacityError(
                f"cannot load adapter {name!r}: all {self.config.max_loras} adapter slots are "
                f"taken by {sorted(self.adapters)}; unload one first"
            )
        self.adapters[name] = lora_id

    async def remove_adapter(self, name: str) -> None:
        """Free ``name``'s slot."""
        if self.options.fail_remove_adapter and re.fullmatch(
            self.options.fail_remove_adapter, name
        ):
            raise UpstreamError(f"mocker: removing adapter {name!r} failed as configured")
        self.adapters.pop(name, None)

    def _check_served(self, model: str) -> None:
        if model != self.config.model_name and model not in self.adapters:
            served = [self.config.model_name, *sorted(self.adapters)]
            raise NotFoundError(f"model {model!r} is not served here; this worker serves {served}")


def _prompt_words(request: GenerateRequest) -> int:
    if request.messages is not None:
        return sum(len(message.content.split()) for message in request.messages)
    return len((request.prompt or "").split())
