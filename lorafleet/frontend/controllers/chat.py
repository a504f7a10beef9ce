"""``POST /v1/chat/completions``: chat, whole or streamed as server-sent events."""

from __future__ import annotations

from typing import Final

from lorafleet.frontend.controllers._generate import generate_controller
from lorafleet.frontend.generate_routes import CHAT_ROUTE
from lorafleet.proto.openai import ChatCompletionResponse

__all__ = ["ChatCompletionsController"]

ChatCompletionsController: Final = generate_controller(
    CHAT_ROUTE, ChatCompletionResponse, name="ChatCompletionsController", tag="chat",
    operation_id="createChatCompletion", summary="Create a chat completion",
)  # fmt: skip
"""OpenAI's chat completions resource."""
