"""The bearer-token rule of every mutating admin route and NATS update; pure, no I/O."""

from __future__ import annotations

import hmac
from typing import Final

__all__ = ["AUTHORIZATION_HEADER", "bearer_header", "bearer_token_accepted"]

AUTHORIZATION_HEADER: Final = "Authorization"
"""The header that carries the token, in HTTP requests and in NATS message headers alike."""


def bearer_token_accepted(authorization: str | None, token: str | None) -> bool:
    """True when no token is configured or ``authorization`` is ``Bearer <token>``.

    Compared in constant time, so the answer's timing tells nothing about the token.
    """
    if not token:
        return True
    return hmac.compare_digest((authorization or "").encode(), f"Bearer {token}".encode())


def bearer_header(token: str | None) -> dict[str, str] | None:
    """The ``Authorization: Bearer <token>`` header to send, or None without a token."""
    return {AUTHORIZATION_HEADER: f"Bearer {token}"} if token else None
