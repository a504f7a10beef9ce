"""Build the generate controllers (chat, completions) from their route descriptions.

This module alone has no ``from __future__ import annotations``: its handler's
annotations name each route's own body and answer types, which Litestar must get as
types (for validation and the OpenAPI document), not as strings to look up here.
"""

from typing import Any

import msgspec
from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from lorafleet.frontend.controllers._responses import GENERATE_ERRORS
from lorafleet.frontend.exchange import SseAnswer
from lorafleet.frontend.generate_routes import GenerateRoute
from lorafleet.frontend.generation import SSE_HEADERS, SSE_MEDIA_TYPE
from lorafleet.frontend.services import Services

__all__ = ["generate_controller"]


def generate_controller(
    route: GenerateRoute[Any],
    answer_type: type[msgspec.Struct],
    *,
    name: str,
    tag: str,
    operation_id: str,
    summary: str,
) -> type[Controller]:
    """A controller named ``name`` whose ``POST`` on ``route`` answers ``answer_type`` whole,
    or streamed as server-sent events."""
    body_type = route.body_type

    class GenerateController(Controller):
        path = route.path
        tags = [tag]

        @post(
            "/",
            operation_id=operation_id,
            status_code=200,
            summary=summary,
            description="With `stream: true` the answer is `text/event-stream`, ending `[DONE]`.",
            responses=GENERATE_ERRORS,
        )
        async def create(
            self,
            request: Request[Any, Any, Any],
            data: JSONBody[body_type],  # type: ignore[valid-type]
            services: NamedDependency[Services],
        ) -> answer_type | Stream:  # type: ignore[valid-type]
            """Answer the request through a worker that serves its model."""
            answer = await services.generation.generate(
                data, route.shape, route.to_generate, request.receive
            )
            if isinstance(answer, SseAnswer):
                return Stream(answer, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)
            return answer

    GenerateController.__name__ = GenerateController.__qualname__ = name
    return GenerateController
