"""The frontend's request class: its JSON bodies decode through ``request_body.decode_json``.

Litestar decodes a JSON body with msgspec, which recurses once per level: a
10,000-deep body raised ``RecursionError``, a 500. Every Litestar route that reads a
JSON body goes through :meth:`BoundedJsonRequest.json`, and the generate door decodes
through the same function, so the depth check and the 400 wording are one.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.types import Empty

from lorafleet.frontend.request_body import decode_json

__all__ = ["BoundedJsonRequest"]


class BoundedJsonRequest(Request[Any, Any, Any]):
    """A Litestar request whose JSON body may nest at most ``MAX_JSON_DEPTH`` levels."""

    async def json(self) -> Any:
        """The decoded body; raises ``InvalidBodyError`` (400) when it is not JSON or nests
        too deeply."""
        if self._json is Empty:
            self._json = decode_json(await self.body())
        return self._json
