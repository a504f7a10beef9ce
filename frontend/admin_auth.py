"""The bearer-token guard of the frontend's mutating admin routes (``DYN_ADMIN_TOKEN``).

Without a configured token the routes are open, as the worker's are without
``DYN_SYSTEM_AUTH_TOKEN``; the frontend logs a warning at start then.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from proto.auth import bearer_token_accepted
from proto.errors import UnauthorizedError

__all__ = ["require_admin_token"]


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
