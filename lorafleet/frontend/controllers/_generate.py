"""Build the generate controllers (chat, completions): the routes' OpenAPI descriptions.

``frontend.generate_door`` answers every ``POST`` to these routes before Litestar routes
it; the controllers give the OpenAPI document its operations (body, answers, errors)
and Litestar its knowledge of the paths (a ``GET`` there is a 405, not a 404).

This module alone has no ``from __future__ import annotations``: its handler's
annotations name each route's own body and answer types, which Litestar must get as
types (for validation and the OpenAPI document), not as strings to look up here.
"""

from typing import Any

import msgspec
from litestar import Controller, post
from litestar.params import JSONBody
from litestar.response import Stream

from lorafleet.frontend.controllers._responses import GENERATE_ERRORS
from lorafleet.frontend.generate_routes import GenerateRoute
from lorafleet.proto.errors import LorafleetError

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
    """A controller named ``name`` describing ``POST`` on ``route``: ``answer_type`` whole,
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
            data: JSONBody[body_type],  # type: ignore[valid-type]
        ) -> answer_type | Stream:  # type: ignore[valid-type]
            """Never runs: ``frontend.generate_door`` answers this route before Litestar."""
            raise LorafleetError(
                f"POST {route.path} reached Litestar: frontend.generate_door must answer it"
            )

    GenerateController.__name__ = GenerateController.__qualname__ = name
    return GenerateController
