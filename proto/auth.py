"""The bearer-token rule of every mutating admin route; pure, no I/O."""

from __future__ import annotations

import hmac

__all__ = ["bearer_token_accepted"]


def bearer_token_accepted(authorization: str | None, token: str | None) -> bool:
    """True when no token is configured or ``authorization`` is ``Bearer <token>``.

    Compared in constant time, so the answer's timing tells nothing about the token.
    """
    if not token:
        return True
    return hmac.compare_digest((authorization or "").encode(), f"Bearer {token}".encode())
