"""What both generate controllers do with a validated body: answer it whole or as SSE."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request
from litestar.response import Stream

from frontend.exchange import SseAnswer
from frontend.generate_routes import GenerateRoute
from frontend.generation import SSE_HEADERS, SSE_MEDIA_TYPE
from frontend.services import Services

__all__ = ["respond"]


async def respond(
    route: GenerateRoute[Any], data: Any, services: Services, request: Request[Any, Any, Any]
) -> msgspec.Struct | Stream:
    """Answer ``data`` on ``route``: the whole answer, or a Litestar stream of its events."""
    answer = await services.generation.generate(
        data, route.shape, route.to_generate, request.receive
    )
    if isinstance(answer, SseAnswer):
        return Stream(answer, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)
    return answer
