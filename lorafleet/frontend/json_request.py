"""The frontend's request class: its JSON bodies decode through ``request_body.decode_json``,
strictly, into the route's own body type.

Litestar decodes a JSON body with msgspec, which recurses once per level: a
10,000-deep body raised ``RecursionError``, a 500. Every Litestar route that reads a
JSON body goes through :meth:`BoundedJsonRequest.json`, and the generate door decodes
through the same function, so the depth check and the 400 wording are one. Litestar then
converts the body to the route's type with ``strict=False``, which would store ``"100"``
as a number; decoded here strictly first, a number sent as a string is refused (400).
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.types import Empty

from lorafleet.frontend.request_body import decode_json

__all__ = ["BoundedJsonRequest"]


class BoundedJsonRequest(Request[Any, Any, Any]):
    """A Litestar request whose JSON body may nest at most ``MAX_JSON_DEPTH`` levels and
    decodes strictly into its route's ``data`` type."""

    async def json(self) -> Any:
        """The decoded body; raises ``InvalidBodyError`` (400) when it is not JSON, nests
        too deeply or is not the route's body type (a string where a number belongs)."""
        if self._json is Empty:
            field = self.route_handler.parsed_data_field
            body_type = Any if field is None else field.annotation
            self._json = decode_json(await self.body(), body_type, strict=True)
        return self._json
