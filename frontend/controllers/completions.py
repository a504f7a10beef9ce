"""``POST /v1/completions``: text completion, whole or streamed as server-sent events."""

from __future__ import annotations

from typing import Any, cast

from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from frontend.controllers._generate import respond
from frontend.controllers._responses import GENERATE_ERRORS
from frontend.generate_routes import COMPLETIONS_ROUTE
from frontend.services import Services
from proto.openai import CompletionRequest, CompletionResponse

__all__ = ["CompletionsController"]


class CompletionsController(Controller):
    """OpenAI's (legacy) completions resource."""

    path = COMPLETIONS_ROUTE.path
    tags = ["completions"]

    @post(
        "/",
        operation_id="createCompletion",
        status_code=200,
        summary="Create a completion",
        description="With `stream: true` the answer is `text/event-stream`, ending `[DONE]`.",
        responses=GENERATE_ERRORS,
    )
    async def create(
        self,
        request: Request[Any, Any, Any],
        data: JSONBody[CompletionRequest],
        services: NamedDependency[Services],
    ) -> CompletionResponse | Stream:
        """Answer a completions request through a worker that serves its model."""
        return cast(
            "CompletionResponse | Stream", await respond(COMPLETIONS_ROUTE, data, services, request)
        )
