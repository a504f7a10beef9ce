"""``POST /v1/chat/completions``: chat, whole or streamed as server-sent events."""

from __future__ import annotations

from typing import Any, cast

from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from frontend.controllers._generate import respond
from frontend.controllers._responses import GENERATE_ERRORS
from frontend.generate_routes import CHAT_ROUTE
from frontend.services import Services
from proto.openai import ChatCompletionRequest, ChatCompletionResponse

__all__ = ["ChatCompletionsController"]


class ChatCompletionsController(Controller):
    """OpenAI's chat completions resource."""

    path = CHAT_ROUTE.path
    tags = ["chat"]

    @post(
        "/",
        operation_id="createChatCompletion",
        status_code=200,
        summary="Create a chat completion",
        description="With `stream: true` the answer is `text/event-stream`, ending `[DONE]`.",
        responses=GENERATE_ERRORS,
    )
    async def create(
        self,
        request: Request[Any, Any, Any],
        data: JSONBody[ChatCompletionRequest],
        services: NamedDependency[Services],
    ) -> ChatCompletionResponse | Stream:
        """Answer a chat request through a worker that serves its model."""
        return cast(
            "ChatCompletionResponse | Stream", await respond(CHAT_ROUTE, data, services, request)
        )
