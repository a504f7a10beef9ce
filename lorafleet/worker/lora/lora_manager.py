"""Resolve adapter URIs to local directories: pluggable sources, a safe cache, one fetch per URI.

It must not load adapters into an engine; the LoRA lifecycle does that with the
path returned here (and pairs :meth:`LoRAManager.acquire` with ``release``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, Final

import structlog

from lorafleet.fleet.adapter_files import adapter_bytes, adapter_problem, pickle_problem
from lorafleet.process.tasks import cancel_and_wait
from lorafleet.proto.errors import LorafleetError, error_body
from lorafleet.proto.uris import is_scheme_name
from lorafleet.worker import metrics
from lorafleet.worker.lora._failures import combine_failures
from lorafleet.worker.lora._redact import redact_uri
from lorafleet.worker.lora.archive import check_plain_tree
from lorafleet.worker.lora.cache import AdapterCache
from lorafleet.worker.lora.config import LoRAManagerConfig, load_source
from lorafleet.worker.lora.custom_source import CustomSource
from lorafleet.worker.lora.errors import (
    LoraConfigError,
    LoraInvalidAdapterError,
    LoraInvalidUriError,
    LoraSourceError,
    LoraUnavailableError,
    adapter_too_big,
    is_local_disk_error,
)
from lorafleet.worker.lora.file_source import FileSource
from lorafleet.worker.lora.hf_source import HfSource
from lorafleet.worker.lora.s3_source import S3ClientFactory, S3Source, default_s3_client
from lorafleet.worker.lora.source import InPlaceSource, LoRASource, VersionedSource
from lorafleet.worker.lora.uri import cache_key, uri_scheme

__all__ = ["DownloadResult", "LoRAManager"]

log = structlog.get_logger(__name__)

TRACEBACK_FRAMES: Final = 3
"""Frames of a crashed source's traceback that are logged (never the exception's text)."""
SIZE_CHECK_INTERVAL_S: Final = 0.1
"""How often a running download's directory is measured against the adapter bound."""

DownloadResult = dict[str, Any]
"""Dynamo's answer shape: ``{"status": "success", "local_path": str}`` or
``{"status": "error", "code": str, "message": str}`` (``proto.errors.error_body``)."""


class LoRAManager:
    """Turns ``source.uri`` into a validated local adapter directory, caching remote ones.

    Examples::

        manager = LoRAManager()                                # DYN_LORA_* (Dynamo's call)
        result = await manager.download_lora("s3://adapters/pirate")  # Dynamo's dict answer
        path = await manager.acquire("s3://adapters/pirate")   # ... engine.add_lora(path) ...
        manager.release("s3://adapters/pirate")                # after engine.remove_lora
    """

    def __init__(
        self,
        cache_path: str | Path | None = None,
        *,
        config: LoRAManagerConfig | None = None,
        s3_client_factory: S3ClientFactory = default_s3_client,
    ) -> None:
        """``cache_path`` (Dynamo's argument) overrides the cache directory; without ``config``
        the ``DYN_LORA_*`` environment is read, so ``LoRAManager()`` honours ``DYN_LORA_PATH``."""
        config = config or LoRAManagerConfig.from_env()
        if cache_path is not None:
            config = dataclasses.replace(config, cache_dir=Path(cache_path).expanduser())
        self.config = config
        self._cache = AdapterCache(self.config.cache_dir, max_bytes=self.config.cache_max_bytes)
        self._sources: dict[str, list[LoRASource]] = {
            "file": [FileSource(roots=self.config.file_roots)],
            "s3": [S3Source(client_factory=s3_client_factory, max_bytes=config.max_adapter_bytes)],
            "hf": [HfSource(max_bytes=config.max_adapter_bytes)],
        }
        for scheme, spec in self.config.sources:
            self._sources.setdefault(scheme, []).append(load_source(scheme, spec))
        self._inflight: dict[str, asyncio.Task[Path]] = {}
        self._users: Counter[str] = Counter()

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        s3_client_factory: S3ClientFactory = default_s3_client,
    ) -> LoRAManager:
        """Build a manager from ``DYN_LORA_*`` (boto3 reads the AWS variables itself)."""
        config = LoRAManagerConfig.from_env(environ)
        return cls(config=config, s3_client_factory=s3_client_factory)

    def supported_schemes(self) -> frozenset[str]:
        """Return the schemes that have a source and are allowed, e.g. ``{"file", "s3"}``."""
        schemes = frozenset(self._sources)
        allowed = self.config.allowed_schemes
        return schemes if allowed is None else schemes & allowed

    def register_custom_source(self, scheme: str, source: object) -> None:
        """Add ``source`` for ``scheme``, tried after the sources already registered for it.

        As in Dynamo, ``source`` needs only an async ``download(uri, dest)``; when it also
        has an async ``exists(uri)``, that is asked first ("LoRA not found at ..." on no).
        """
        if not is_scheme_name(scheme):
            raise LoraConfigError(f"invalid scheme name {scheme!r} (lower-case, e.g. 'hf')")
        source = CustomSource(scheme, source)
        self._sources.setdefault(scheme, []).append(source)
        allowed = self.config.allowed_schemes is None or scheme in self.config.allowed_schemes
        log.info("lora.source_registered", scheme=scheme, source=_name(source), allowed=allowed)

    def is_cached(self, uri: str) -> bool:
        """Return whether ``download(uri)`` would succeed now without any network call."""
        try:
            sources = self._sources_for(uri)
        except LoraSourceError:
            return False
        for source in sources:
            if isinstance(source, InPlaceSource):
                try:
                    source.local_path(uri)
                except (LoraSourceError, OSError):
                    continue
                return True
        try:
            return self._cache.lookup(cache_key(uri), touch=False) is not None
        except OSError:
            return False

    async def download(self, uri: str, *, refresh: bool = False) -> Path:
        """Return the local adapter directory of ``uri``, fetching it once if not cached.

        With ``refresh`` (an explicit reload: a swap), a cached copy from a source that can
        tell its version (S3's ETags) is used only while the source still holds that
        version; otherwise it is fetched again and replaces the copy. Concurrent calls for
        one URI share a single download; a caller that is cancelled does not cancel it for
        the others.
        """
        self._sources_for(uri)
        key = cache_key(uri)
        task = self._inflight.get(key)
        if task is None:
            resolve = self._resolve(uri, key, refresh=refresh)
            task = asyncio.create_task(resolve, name=f"lora-download-{key}")
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
        return await asyncio.shield(task)

    async def download_lora(self, uri: str) -> DownloadResult:
        """Dynamo's call: :meth:`download`, answering a dict instead of raising.

        ``{"status": "success", "local_path": "/cache/s3_..."}`` or
        ``{"status": "error", "code": "not_found", "message": "LoRA source ...: LoRA not ..."}``.
        """
        try:
            path = await self.download(uri)
        except LorafleetError as exc:
            return error_body(exc.to_info())
        return {"status": "success", "local_path": str(path)}

    async def acquire(self, uri: str, *, refresh: bool = False) -> Path:
        """Download ``uri`` (see :meth:`download` for ``refresh``) and mark its cache entry
        in use until :meth:`release`."""
        key = cache_key(uri)
        self._users[key] += 1
        try:
            if self._users[key] == 1:
                await self._mark_in_use(uri, key)
            return await self.download(uri, refresh=refresh)
        except BaseException:
            self.release(uri)
            raise

    def release(self, uri: str) -> None:
        """Undo one :meth:`acquire`: once no loaded adapter uses the entry, it may be evicted."""
        key = cache_key(uri)
        if self._users[key] <= 0:
            log.warning("lora.release_without_acquire", uri=redact_uri(uri))
            return
        self._users[key] -= 1
        if self._users[key] == 0:
            del self._users[key]
            try:
                self._cache.unmark_in_use(key)
            except OSError as exc:
                log.warning("lora.unmark_failed", uri=redact_uri(uri), error=type(exc).__name__)

    def forget(self, uri: str) -> bool:
        """Delete the cached copy of ``uri`` unless a loaded adapter uses it or a download of
        it runs, so the next load downloads again; whether a copy was deleted (in-place
        ``file://`` adapters have none)."""
        key = cache_key(uri)
        if self._users[key] > 0 or key in self._inflight:
            log.warning("lora.forget_in_use", uri=redact_uri(uri), key=key)
            return False
        try:
            removed = self._cache.remove(key)
        except OSError as exc:
            log.warning("lora.forget_failed", uri=redact_uri(uri), error=type(exc).__name__)
            return False
        if removed:
            log.info("lora.forgotten", uri=redact_uri(uri), key=key)
        return removed

    async def aclose(self) -> None:
        """Cancel downloads in flight (their private directories are deleted) and wait for them."""
        await cancel_and_wait(*self._inflight.values())

    async def __aenter__(self) -> LoRAManager:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _mark_in_use(self, uri: str, key: str) -> None:
        try:
            await asyncio.to_thread(self._cache.mark_in_use, key)
        except OSError as exc:
            raise self._disk_error(uri, exc) from exc

    def _sources_for(self, uri: str) -> list[LoRASource]:
        scheme = uri_scheme(uri)
        sources = self._sources.get(scheme)
        if not sources or scheme not in self.supported_schemes():
            supported = ", ".join(sorted(self.supported_schemes()))
            why = "is not allowed here" if sources else "has no source"
            raise LoraInvalidUriError(
                uri, f"scheme {scheme!r} {why}", hint=f"use one of: {supported}"
            )
        return sources

    def _forget(self, key: str, task: asyncio.Task[Path]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved here so that an unawaited failure is not reported twice

    async def _resolve(self, uri: str, key: str, *, refresh: bool) -> Path:
        try:
            hit = await asyncio.to_thread(self._cache.lookup, key)
        except OSError as exc:
            raise self._disk_error(uri, exc) from exc
        stale = hit is not None and refresh and not await self._current(uri, key)
        if hit is not None and not stale:
            log.debug("lora.cache_hit", uri=redact_uri(uri), key=key)
            metrics.ADAPTER_CACHE_LOOKUPS.labels("hit").inc()
            return hit
        metrics.ADAPTER_CACHE_LOOKUPS.labels("miss").inc()
        sources = self._sources_for(uri)
        ordered: list[LoRASource] = [s for s in sources if isinstance(s, InPlaceSource)]
        ordered += [s for s in sources if not isinstance(s, InPlaceSource)]
        failures: list[tuple[str, LoraSourceError]] = []
        for source in ordered:
            try:
                return await self._fetch(source, uri, key, replace=stale)
            except LoraSourceError as exc:
                log.warning(
                    "lora.source_failed",
                    uri=redact_uri(uri),
                    source=_name(source),
                    code=exc.code,
                    reason=exc.reason,
                )
                failures.append((_name(source), exc))
        raise combine_failures(uri, failures)

    async def _current(self, uri: str, key: str) -> bool:
        """Whether the cached copy of ``uri`` is the version its source holds now (True
        when no source of its scheme can tell); a source that cannot be asked fails the
        reload, as a download would."""
        versioned = [s for s in self._sources_for(uri) if isinstance(s, VersionedSource)]
        if not versioned:
            return True
        recorded = await asyncio.to_thread(self._cache.version_of, key)
        current = await versioned[0].version_tag(uri)
        if recorded != current:
            log.info("lora.cache_stale", uri=redact_uri(uri), key=key)
        return recorded == current

    async def _fetch(self, source: LoRASource, uri: str, key: str, *, replace: bool) -> Path:
        """Resolve ``uri`` through one source; local disk failures become our errors too."""
        try:
            if isinstance(source, InPlaceSource):
                path = await asyncio.to_thread(source.local_path, uri)
                await asyncio.to_thread(self._check_files, uri, path)
                return path
            return await self._fetch_into_cache(source, uri, key, replace=replace)
        except OSError as exc:
            raise self._disk_error(uri, exc) from exc

    def _disk_error(self, uri: str, exc: OSError) -> LoraUnavailableError:
        return LoraUnavailableError(
            uri,
            f"local file system error ({type(exc).__name__}: {exc.strerror or 'no detail'})",
            hint=f"check permissions and free space of the path and of {self.config.cache_dir}",
        )

    async def _fetch_into_cache(
        self, source: LoRASource, uri: str, key: str, *, replace: bool
    ) -> Path:
        """Download into a private directory, validate, rename into the cache (replacing a
        stale copy), apply the cap. The source's version is asked before the download: an
        object changed meanwhile is fetched again at the next reload, never missed."""
        started = time.monotonic()
        dest = await asyncio.to_thread(self._cache.new_download_dir, key)
        try:
            version = await source.version_tag(uri) if isinstance(source, VersionedSource) else None
            built = await self._call_source(source, uri, dest)
            if built.is_relative_to(dest):
                await asyncio.to_thread(check_plain_tree, built, uri=uri)
            problem = await asyncio.to_thread(adapter_problem, built)
            if problem is not None:
                raise LoraInvalidAdapterError(uri, problem, hint="upload a complete PEFT adapter")
            await asyncio.to_thread(self._check_files, uri, built)
            if not built.is_relative_to(dest):
                return built
            commit = functools.partial(self._cache.commit, version=version, replace=replace)
            entry = await asyncio.to_thread(commit, key, built)
            metrics.ADAPTER_CACHE_BYTES.inc(await asyncio.to_thread(adapter_bytes, entry))
            keep = {key, *self._users, *self._inflight}
            await asyncio.to_thread(self._cache.evict, keep=keep)
        finally:
            await asyncio.to_thread(self._cache.discard, dest)
        log.info(
            "lora.downloaded",
            uri=redact_uri(uri),
            key=key,
            source=_name(source),
            seconds=round(time.monotonic() - started, 3),
        )
        return entry

    def _check_files(self, uri: str, path: Path) -> None:
        """Refuse a pickle unless allowed, and an adapter over ``max_adapter_bytes``."""
        problem = None if self.config.allow_pickle else pickle_problem(path)
        if problem is not None:
            raise LoraInvalidAdapterError(uri, problem, hint="safetensors only, by default")
        bound = self.config.max_adapter_bytes
        if bound is not None and (size := adapter_bytes(path)) > bound:
            raise adapter_too_big(uri, size, bound)

    async def _call_source(self, source: LoRASource, uri: str, dest: Path) -> Path:
        """Run one source's download, turning a timeout or a foreign exception into our error."""
        try:
            async with asyncio.timeout(self.config.download_timeout_s):
                download = source.download(uri, dest)
                return Path(await self._bounded(download, uri, dest, _bookkeeping(source)))
        except LoraSourceError:
            raise
        except TimeoutError as exc:
            raise LoraUnavailableError(
                uri,
                f"source {_name(source)} timed out after {self.config.download_timeout_s} s",
                hint="retry later",
            ) from exc
        except Exception as exc:
            if is_local_disk_error(exc):
                raise  # ``_fetch`` names the cache's disk
            log.warning(
                "lora.source_crashed",
                uri=redact_uri(uri),
                source=_name(source),
                error_type=type(exc).__name__,
                where="".join(traceback.format_tb(exc.__traceback__)[-TRACEBACK_FRAMES:]),
            )
            raise LoraUnavailableError(
                uri,
                f"source {_name(source)} failed with {type(exc).__name__}",
                hint="see the worker log (lora.source_crashed) for where it failed",
            ) from exc

    async def _bounded(
        self, download: Awaitable[Path], uri: str, dest: Path, bookkeeping: tuple[str, ...]
    ) -> Path:
        """Await ``download``, cancelling it once ``dest`` holds more than the adapter bound.

        A backstop for sources that cannot bound themselves (custom ones): S3 stops its own
        stream, and an archive's extraction, at the bound. Checked every
        ``SIZE_CHECK_INTERVAL_S``, so a source may write past the bound for that long before
        it is cut off; the download directory is removed.
        The source's ``bookkeeping`` entries in ``dest`` (removed before it returns) are not
        counted, so a bound equal to an adapter's size lets it through.
        """
        bound = self.config.max_adapter_bytes
        task = asyncio.ensure_future(download)
        try:
            while bound is not None and not task.done():
                await asyncio.wait({task}, timeout=SIZE_CHECK_INTERVAL_S)
                if (size := await asyncio.to_thread(adapter_bytes, dest, bookkeeping)) > bound:
                    raise adapter_too_big(uri, size, bound)
            return await task
        finally:
            task.cancel()


def _bookkeeping(source: LoRASource) -> tuple[str, ...]:
    """The top-level names a source writes into its ``dest`` for itself (optional
    ``bookkeeping`` attribute; none by default)."""
    return tuple(getattr(source, "bookkeeping", ()))


def _name(source: LoRASource) -> str:
    return str(getattr(source, "name", type(source).__name__))
