"""The bearer-token guard of the frontend's mutating admin routes (``DYN_ADMIN_TOKEN``),
and ``admin_post``, the one way to declare such a route.

Without a configured token the routes are open, as the worker's are without
``DYN_SYSTEM_AUTH_TOKEN``; the frontend logs a warning at start then.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from litestar import post
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.openapi.datastructures import ResponseSpec

from lorafleet.process.auth import bearer_token_accepted
from lorafleet.proto.errors import UnauthorizedError

__all__ = ["admin_post", "require_admin_token"]


def require_admin_token(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Litestar guard: raise ``UnauthorizedError`` (401) unless the bearer token matches."""
    token: str | None = connection.app.state.config.admin_token
    if not bearer_token_accepted(connection.headers.get("authorization"), token):
        raise UnauthorizedError(
            "this route changes the fleet's desired adapters and needs "
            "'Authorization: Bearer <token>' (the frontend's DYN_ADMIN_TOKEN)"
        )


def admin_post(
    path: str, *, operation_id: str, summary: str, responses: Mapping[int, ResponseSpec],
    status_code: int | None = None, description: str | None = None,
) -> post:  # fmt: skip
    """Litestar's ``@post`` for a route that changes the desired state: it needs the token."""
    return post(
        path, operation_id=operation_id, summary=summary, description=description,
        status_code=status_code, guards=[require_admin_token], responses=dict(responses),
    )  # fmt: skip
