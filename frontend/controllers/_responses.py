"""OpenAPI descriptions of the error answers every generate route can give."""

from __future__ import annotations

from typing import Final

from litestar.openapi.datastructures import ResponseSpec

from lorafleet.proto.openai import OpenAIErrorResponse

__all__ = ["GENERATE_ERRORS", "MODEL_ERRORS"]


def _error(description: str) -> ResponseSpec:
    return ResponseSpec(data_container=OpenAIErrorResponse, description=description)


MODEL_ERRORS: Final = {404: _error("No live instance serves the model; the message lists models")}
GENERATE_ERRORS: Final = {
    400: _error("Invalid body; the message names the field"),
    **MODEL_ERRORS,
    424: _error("The adapter's last load failed; the message names the worker's error"),
    429: _error("No free adapter slot, or too many requests wait for the adapter's load"),
    502: _error("The worker failed; the message is the worker's"),
    503: _error("No live instance answered"),
}
