"""The engine's controls and updates by path, and the one place they meet the wire.

Paths are ``control/<name>`` and ``update/<name>``. HTTP (the status server)
hands :meth:`EngineRegistry.call` the JSON object body, NATS (the endpoint) the typed
``UpdateRequest.update`` when the frontend sent one, else its JSON object; it decodes
an object into the route's Struct (a typed body must already be it), calls the typed handler and
encodes its answer or error as an :class:`UpdateReply`. Nothing is callable
until ``register`` ran (start-up step 4), so no update can run before the
engine holds its endpoint.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import msgspec
import structlog

from lorafleet.proto.errors import (
    InvalidRequestError,
    LorafleetError,
    NotFoundError,
    UnavailableError,
    error_body,
    http_status,
)
from lorafleet.proto.inference import UpdateReply
from lorafleet.worker.engine import EngineRoute, LLMEngine

__all__ = ["EngineRegistry", "UpdateBody", "error_reply"]

UpdateBody: TypeAlias = dict[str, Any] | msgspec.Struct
"""An update's body: a JSON object (HTTP, older frontends) or already typed (NATS)."""

log = structlog.get_logger(__name__)


class EngineRegistry:
    """Maps ``control/<name>``/``update/<name>`` to the engine's typed routes."""

    def __init__(self) -> None:
        self._routes: dict[str, EngineRoute[Any]] | None = None
        self._explanations: dict[str, str] = {}

    def explain_missing(self, paths: list[str], message: str) -> None:
        """Answer ``message`` (404) instead of "no engine route" for these absent paths."""
        self._explanations |= dict.fromkeys(paths, message)

    @property
    def registered(self) -> bool:
        """True once the engine's routes are registered."""
        return self._routes is not None

    @property
    def paths(self) -> list[str]:
        """Every registered path, sorted."""
        return sorted(self._routes or {})

    def register(self, engine: LLMEngine) -> None:
        """Register the engine's controls and updates (start-up step 4)."""
        routes = {f"control/{n}": r for n, r in engine.supported_controls().items()}
        routes |= {f"update/{n}": r for n, r in engine.supported_updates().items()}
        self._routes = routes

    async def call(self, path: str, body: UpdateBody) -> UpdateReply:
        """Run the route at ``path`` on a JSON object body or a typed one (NATS's
        ``UpdateRequest.update``); every outcome is an ``UpdateReply``, never an exception."""
        try:
            route = self._route(path)
            result = await route.handler(_decode(body, route.body_type))
        except LorafleetError as exc:
            return error_reply(exc)
        except Exception as exc:
            log.exception("engine handler failed", path=path)
            return error_reply(LorafleetError(f"{path} failed: {exc}"))
        return UpdateReply(status_code=200, body=msgspec.to_builtins(result))

    def _route(self, path: str) -> EngineRoute[Any]:
        if self._routes is None:
            raise UnavailableError("worker is starting; engine routes are not ready")
        route = self._routes.get(path)
        if route is None and path in self._explanations:
            raise NotFoundError(self._explanations[path])
        if route is None:
            raise NotFoundError(f"no engine route {path!r}; available: {self.paths}")
        return route


def error_reply(error: LorafleetError) -> UpdateReply:
    """``error`` as the engine routes answer it: typed for NATS callers, the documented body
    (with the error's fields, e.g. ``lora_name``) for HTTP callers."""
    info = error.to_info()
    return UpdateReply(
        status_code=http_status(info.code), body=error_body(info, **error.fields), error=info
    )


def _decode(body: UpdateBody, kind: type[msgspec.Struct]) -> Any:
    if isinstance(body, msgspec.Struct):
        if not isinstance(body, kind):
            raise InvalidRequestError(
                f"a {type(body).__name__} body was sent to the update that takes {kind.__name__}"
            )
        return body
    try:
        return msgspec.convert(body, kind)
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(f"invalid {kind.__name__} body: {exc}") from exc
