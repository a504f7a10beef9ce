"""``POST /v1/completions``: text completion, whole or streamed as server-sent events."""

from __future__ import annotations

from typing import Final

from lorafleet.frontend.controllers._generate import generate_controller
from lorafleet.frontend.generate_routes import COMPLETIONS_ROUTE
from lorafleet.proto.openai import CompletionResponse

__all__ = ["CompletionsController"]

CompletionsController: Final = generate_controller(
    COMPLETIONS_ROUTE, CompletionResponse, name="CompletionsController", tag="completions",
    operation_id="createCompletion", summary="Create a completion",
)  # fmt: skip
"""OpenAI's (legacy) completions resource."""
