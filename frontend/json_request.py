"""The frontend's request class: refuses JSON nested too deeply before msgspec decodes it.

Litestar decodes a JSON body with msgspec, which recurses once per level: a
10,000-deep body raised ``RecursionError``, a 500. Every route that reads a
JSON body goes through :meth:`BoundedJsonRequest.json`, so checking there
covers them all.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from lorafleet.proto.limits import check_json_depth

__all__ = ["BoundedJsonRequest"]


class BoundedJsonRequest(Request[Any, Any, Any]):
    """A Litestar request whose JSON body may nest at most ``MAX_JSON_DEPTH`` levels."""

    async def json(self) -> Any:
        """The decoded body; raises ``InvalidRequestError`` (400) when it nests too deeply."""
        check_json_depth(await self.body())
        return await super().json()
