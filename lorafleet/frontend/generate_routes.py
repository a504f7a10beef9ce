"""The two OpenAI generate routes, described once: path, body type, answer shape, builder.

``frontend.generate_door`` answers the routes from these descriptions, and the Litestar
controllers describe them in the OpenAPI document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from lorafleet.frontend.generation import ToGenerate
from lorafleet.frontend.shapes import CHAT, COMPLETIONS, Shape
from lorafleet.frontend.translate import chat_to_generate, completion_to_generate
from lorafleet.proto.openai import ChatCompletionRequest, CompletionRequest

__all__ = [
    "CHAT_ROUTE",
    "COMPLETIONS_ROUTE",
    "ENDPOINT_BY_PATH",
    "GENERATE_ROUTES",
    "GenerateRoute",
]

_Body = TypeVar("_Body", ChatCompletionRequest, CompletionRequest)


@dataclass(frozen=True, kw_only=True, slots=True)
class GenerateRoute(Generic[_Body]):
    """One ``POST`` route that generates: what its body decodes to and how it is answered."""

    path: str
    body_type: type[_Body]
    shape: Shape
    to_generate: ToGenerate[_Body]


CHAT_ROUTE: Final = GenerateRoute(
    path="/v1/chat/completions", body_type=ChatCompletionRequest, shape=CHAT,
    to_generate=chat_to_generate,
)  # fmt: skip
COMPLETIONS_ROUTE: Final = GenerateRoute(
    path="/v1/completions", body_type=CompletionRequest, shape=COMPLETIONS,
    to_generate=completion_to_generate,
)  # fmt: skip
GENERATE_ROUTES: Final[tuple[GenerateRoute[Any], ...]] = (CHAT_ROUTE, COMPLETIONS_ROUTE)
ENDPOINT_BY_PATH: Final = {route.path: route.shape.endpoint for route in GENERATE_ROUTES}
"""The metrics' ``endpoint`` label of each generate route."""
