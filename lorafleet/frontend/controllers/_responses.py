"""OpenAPI descriptions of error answers: those every generate route can give, and those
every admin write gives (``ADMIN_ERRORS``)."""

from __future__ import annotations

from typing import Final

from litestar.openapi.datastructures import ResponseSpec

from lorafleet.proto.openai import OpenAIErrorResponse

__all__ = ["ADMIN_ERRORS", "GENERATE_ERRORS", "MODEL_ERRORS", "READ_ERRORS", "error_answer"]


def error_answer(description: str) -> ResponseSpec:
    """An error answer in OpenAI's shape (``{"error": {...}}``), described for OpenAPI."""
    return ResponseSpec(data_container=OpenAIErrorResponse, description=description)


ADMIN_ERRORS: Final = {
    401: error_answer("DYN_ADMIN_TOKEN is set and the bearer token is missing or wrong"),
    503: error_answer("etcd is unavailable"),
}
"""What every write of the fleet's desired state may answer besides its own errors."""

READ_ERRORS: Final = {
    401: error_answer("Tenants exist, and neither the admin token nor an API key was sent"),
}
"""What every read of the fleet's adapters and aliases may answer besides its own errors."""


MODEL_ERRORS: Final = {
    404: error_answer("No live instance serves the model; the message lists models"),
}
GENERATE_ERRORS: Final = {
    400: error_answer("Invalid body; the message names the field"),
    **MODEL_ERRORS,
    424: error_answer("The adapter's last load failed; the message names the worker's error"),
    429: error_answer("No free adapter slot, or too many requests wait for the adapter's load"),
    502: error_answer("The worker failed; the message is the worker's"),
    503: error_answer("No live instance answered"),
}
