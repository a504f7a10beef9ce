"""The engine's controls and updates by path, callable from HTTP and from NATS alike.

Paths are ``control/<name>`` and ``update/<name>``; the engine sees the bare
name. Nothing is callable until ``register`` ran (start-up step 4), so no
update can run before the engine holds its endpoint.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from proto.errors import LorafleetError, http_status
from proto.inference import UpdateReply
from worker.engine import EngineHandler, LLMEngine

__all__ = ["EngineRegistry", "error_reply"]

log = structlog.get_logger(__name__)


class EngineRegistry:
    """Maps ``control/<name>``/``update/<name>`` to the engine's handlers."""

    def __init__(self) -> None:
        self._handlers: dict[str, EngineHandler] | None = None
        self._explanations: dict[str, str] = {}

    def explain_missing(self, paths: list[str], message: str) -> None:
        """Answer ``message`` (404) instead of "no engine route" for these absent paths."""
        self._explanations |= dict.fromkeys(paths, message)

    @property
    def registered(self) -> bool:
        """True once the engine's handlers are registered."""
        return self._handlers is not None

    @property
    def paths(self) -> list[str]:
        """Every registered path, sorted."""
        return sorted(self._handlers or {})

    def register(self, engine: LLMEngine) -> None:
        """Register the engine's controls and updates (start-up step 4)."""
        handlers = {f"control/{n}": h for n, h in engine.supported_controls().items()}
        handlers |= {f"update/{n}": h for n, h in engine.supported_updates().items()}
        self._handlers = handlers

    async def call(self, path: str, body: dict[str, Any]) -> UpdateReply:
        """Run the handler at ``path``; every outcome is an ``UpdateReply``, never an exception."""
        if self._handlers is None:
            return error_reply(
                503, "unavailable", "worker is starting; engine routes are not ready"
            )
        handler = self._handlers.get(path)
        if handler is None and path in self._explanations:
            return error_reply(404, "not_found", self._explanations[path])
        if handler is None:
            return error_reply(
                404, "not_found", f"no engine route {path!r}; available: {self.paths}"
            )
        try:
            result = await handler(body)
        except LorafleetError as exc:
            return error_reply(http_status(exc.code), exc.code, exc.message, **exc.fields)
        except Exception as exc:
            log.exception("engine handler failed", path=path)
            return error_reply(500, "internal_error", f"{path} failed: {exc}")
        return UpdateReply(status_code=200, body=msgspec.to_builtins(result))


def error_reply(status_code: int, code: str, message: str, **fields: Any) -> UpdateReply:
    """An error as an engine reply, in the body shape every engine route answers."""
    body = {"status": "error", "code": code, "message": message, **fields}
    return UpdateReply(status_code=status_code, body=body)
