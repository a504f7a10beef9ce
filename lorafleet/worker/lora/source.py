"""The interface an adapter source implements, one per URI scheme (or several, tried in order).

Edit together with docs/lora-manager.md, which tells operators how to write one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["InPlaceSource", "LoRASource", "VersionedSource"]


@runtime_checkable
class LoRASource(Protocol):
    """Fetches the adapter named by a URI into a directory the manager provides.

    ``download`` gets ``dest``, an empty directory private to this download; it
    writes the adapter files into it and returns ``dest`` (or a directory inside
    it). The manager validates the result and renames it into the cache, so a
    source never touches the cache itself. Returning a directory outside
    ``dest`` means "use it in place": it is validated but neither copied nor
    cached. Known failures are raised as ``worker.lora.errors.LoraSourceError``
    subclasses; anything else is reported as the source being unavailable.
    ``download`` must not block the event loop (use ``asyncio.to_thread``). A source
    that keeps files of its own in ``dest`` while it runs (and removes them before it
    returns) may name their top-level entries in a ``bookkeeping`` tuple attribute, so
    the manager's size watch does not count them.
    """

    async def download(self, uri: str, dest: Path) -> Path:
        """Fetch the adapter at ``uri`` into ``dest`` and return its directory."""
        ...

    async def exists(self, uri: str) -> bool:
        """Return whether something exists at ``uri`` (without downloading it)."""
        ...


@runtime_checkable
class InPlaceSource(LoRASource, Protocol):
    """A source whose adapters already lie on a local disk (``file://``): never copied."""

    def local_path(self, uri: str) -> Path:
        """Return the validated local directory of ``uri`` or raise a ``LoraSourceError``."""
        ...


@runtime_checkable
class VersionedSource(LoRASource, Protocol):
    """A remote source that can tell, without downloading, which version of an adapter it
    holds now (S3: the objects' ETags). The manager records it with the cached copy, and an
    explicit reload (a swap) fetches again when the source's version is another."""

    async def version_tag(self, uri: str) -> str:
        """A short text that changes whenever the adapter's files at ``uri`` change."""
        ...
