"""Dynamo-style custom sources: a class with only an async ``download``, ``exists`` optional.

Wraps what ``register_custom_source`` is given so the manager sees a full
:class:`~worker.lora.source.LoRASource`: when the source has ``exists``, it is
asked first and "no" becomes "LoRA not found at ..." (as in Dynamo).
"""

from __future__ import annotations

import inspect
from pathlib import Path

from lorafleet.worker.lora._redact import redact_uri
from lorafleet.worker.lora.errors import LoraConfigError, LoraNotFoundError

__all__ = ["CustomSource"]


class CustomSource:
    """A registered source; asks ``exists`` (when it has one) before ``download``."""

    def __init__(self, scheme: str, source: object) -> None:
        if not inspect.iscoroutinefunction(getattr(source, "download", None)):
            raise LoraConfigError(f"source for {scheme!r} has no async download(uri, dest) method")
        exists = getattr(source, "exists", None)
        if exists is not None and not inspect.iscoroutinefunction(exists):
            raise LoraConfigError(f"source for {scheme!r} has an exists() that is not async")
        self.inner = source
        self.name = str(getattr(source, "name", type(source).__name__))
        self.bookkeeping = tuple(str(entry) for entry in getattr(source, "bookkeeping", ()))
        """Top-level entries of its download that are the source's own (``LoRASource``)."""

    async def download(self, uri: str, dest: Path) -> Path:
        """Check ``exists`` when the source has it, then let the source download into ``dest``."""
        if not await self.exists(uri):
            raise LoraNotFoundError(
                uri, f"LoRA not found at {redact_uri(uri)}", hint=f"check the {self.name} store"
            )
        return Path(await self.inner.download(uri, dest))  # type: ignore[attr-defined]

    async def exists(self, uri: str) -> bool:
        """The source's answer, or True when it cannot tell (no ``exists``)."""
        exists = getattr(self.inner, "exists", None)
        return True if exists is None else bool(await exists(uri))
