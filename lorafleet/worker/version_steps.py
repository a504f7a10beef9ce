"""The steps that move one adapter version through the engine and etcd, each undoable.

fetch (resolve, digest, and the checks that need the files: the expected digest and the
base model, so the engine never reads a refused adapter), add, publish (the one instant new
requests switch to it), retire (a swap's old version leaves), discard (undo a version that did
not make it) and remove_all (unload, eviction). ``worker.lora_controller`` decides which steps
run, under the record's lock and within the slots; this module does no bookkeeping of slots or
names.

Every version that leaves the engine with requests possibly running on it leaves one way,
:meth:`VersionSteps.drain_and_remove`: new requests already no longer reach it (its card was
replaced or retracted, its phase is ``DRAINING``), its running requests (``busy``, the
record's ledger) get up to the drain timeout (``--lora-drain-timeout-s``) to finish, then the
engine removes it and ends what still runs with ``AdapterEngine.unloaded_error``. Engines do
not drain on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Final, Protocol

import msgspec
import structlog

from lorafleet.proto.discovery import LoraInfo, ModelDeploymentCard
from lorafleet.proto.errors import ConflictError, LorafleetError, UpstreamError
from lorafleet.proto.naming import lora_id, lora_slug
from lorafleet.worker.adapter_record import AdapterRecord, AdapterVersion, Phase
from lorafleet.worker.base_model_check import BaseModelPolicy
from lorafleet.worker.engine import AdapterBackend, ModelEndpoint
from lorafleet.worker.lora import redact_uri
from lorafleet.worker.lora.digest import content_digest

__all__ = ["AdapterSource", "VersionSteps", "step"]

log = structlog.get_logger(__name__)

DIGEST_ATTEMPTS: Final = 5
"""Reads of an adapter folder whose files vanished under the digest: another worker that
shares the cache folder is swapping its entry (renamed away, then the new one renamed in,
microseconds apart). The read after the swap digests the new files."""
DIGEST_RETRY_S: Final = 0.01


class AdapterSource(Protocol):
    """What the lifecycle needs from the LoRA manager: resolve a URI to a local directory."""

    def supported_schemes(self) -> frozenset[str]:
        """URI schemes that can be loaded."""
        ...

    async def acquire(self, uri: str, *, refresh: bool = False) -> Path:
        """Download (or find cached) and mark in use by a loaded adapter; with ``refresh``
        (a reload), a cached copy the source has changed since is fetched again."""
        ...

    def release(self, uri: str) -> None:
        """The adapter from ``uri`` was unloaded; its cache entry may be evicted."""
        ...

    def forget(self, uri: str) -> bool:
        """Delete the cached copy of ``uri`` unless a loaded adapter uses it (a retry
        downloads it again); whether one was deleted."""
        ...


class VersionSteps:
    """Runs one version's steps against the engine, etcd and the LoRA manager.

    Example::

        steps = VersionSteps(backend=engine, endpoint=endpoint, source=manager, base_card=card,
                             base_check=policy, drain_timeout_s=30.0)
        await steps.fetch(version); await steps.add(version); await steps.publish(record, version)
    """

    def __init__(
        self, *, backend: AdapterBackend, endpoint: ModelEndpoint, source: AdapterSource,
        base_card: ModelDeploymentCard, base_check: BaseModelPolicy, drain_timeout_s: float,
    ) -> None:  # fmt: skip
        self.backend = backend
        self.drain_timeout_s = drain_timeout_s
        """How long a leaving version's running requests get to finish (one bound for all)."""
        self._endpoint = endpoint
        self.source = source
        self._base_card = base_card
        self._base_check = base_check
        self._finished = asyncio.Event()
        """Set when a request ends: a draining version waits for its last one."""

    def request_ended(self) -> None:
        """A request ended (a draining version may now be idle)."""
        self._finished.set()

    async def fetch(self, version: AdapterVersion, *, refresh: bool = False) -> None:
        """Resolve the source to a directory (``refresh``: as the source holds it now, not as
        cached), digest its files (once per load), and refuse them unless they have the
        expected digest and suit the base model."""
        path = await self.source.acquire(version.uri, refresh=refresh)
        try:
            version.digest = await asyncio.to_thread(_settled_digest, path)
            mismatched = version.expected not in (None, version.digest)
            if not mismatched:
                check = self._base_check.check
                version.warnings = await asyncio.to_thread(check, version.name, path)
        except OSError as exc:
            self.source.release(version.uri)
            raise UpstreamError(f"cannot read adapter files at {path}: {exc}") from exc
        except BaseException:
            self.source.release(version.uri)
            raise
        if mismatched:  # its cached copy goes: a retry downloads it again
            self.source.release(version.uri)
            raise _mismatch(version, deleted=self.source.forget(version.uri))
        version.path = path
        version.lora_id = lora_id(version.name, version.digest)
        version.card = self._card(version)

    async def add(self, version: AdapterVersion) -> None:
        """Have the engine add the version under its own key (beside any older version)."""
        assert version.path is not None
        version.enter(Phase.ADDING)
        await self.backend.add_adapter(version.key, version.lora_id, version.path)
        version.enter(Phase.LOADED)

    async def publish(self, record: AdapterRecord, version: AdapterVersion) -> None:
        """Put the version's card (replacing an older version's in one put), then switch new
        requests to it: the one instant of a swap."""
        assert version.card is not None
        await self._endpoint.register_model(version.card)
        for older in record.versions:
            if older is not version and older.phase is Phase.PUBLISHED:
                older.enter(Phase.DRAINING)
        version.enter(Phase.PUBLISHED)

    async def discard(self, record: AdapterRecord, version: AdapterVersion) -> None:
        """Undo a version that did not make it; any older one keeps serving."""
        if version.phase is Phase.LOADED:  # a failed add leaves nothing in the engine
            try:
                await self.backend.remove_adapter(version.key)
            except Exception:
                log.exception("rollback failed: version stays in the engine", adapter=version.name,
                              digest=version.digest)  # fmt: skip
                version.enter(Phase.DRAINING)  # holds its slot; serves nothing
                return
        if version.path is not None:
            self.source.release(version.uri)
        if version in record.versions:
            record.forget(version)

    async def retire(self, record: AdapterRecord, old: AdapterVersion) -> None:
        """Remove a swap's old version (already ``DRAINING``: the new card took its requests)
        once drained; a failed removal leaves it holding its slot, serving nothing."""
        try:
            await self.drain_and_remove(record, [old])
        except Exception:
            log.exception("old version not removed; it keeps its slot", adapter=old.name)

    async def remove_all(self, record: AdapterRecord) -> int:
        """Stop resolving requests to the adapter, retract its card, then drain and remove every
        version; the record keeps source and digest. A failed removal publishes the card
        again. The number of requests that were ended."""
        serving = record.serving
        assert serving is not None and serving.card is not None
        was = serving.phase
        serving.enter(Phase.DRAINING)  # the worker resolves no new request to it from now on
        try:
            if was is Phase.PUBLISHED:
                await self._endpoint.unregister_model(serving.card)
        except BaseException:
            serving.enter(was)  # its card stays (owned: put back if it went), and so does it
            raise
        older = [v for v in record.versions if v.holds_slot and v is not serving]
        try:  # the serving version last: a failure leaves it there to publish again
            ended = await self.drain_and_remove(record, [*older, serving])
        except BaseException as exc:
            log.warning("removing adapter failed; publishing it again",
                        adapter=record.name, error=str(exc))  # fmt: skip
            await self.publish(record, serving)
            raise
        log.info("adapter unloaded", adapter=record.name, requests_ended=ended)
        return ended

    async def drain_and_remove(self, record: AdapterRecord, versions: list[AdapterVersion]) -> int:
        """The one way a version that may have requests leaves: wait until its running requests
        end, at most ``drain_timeout_s``, then have the engine remove it (ending those left
        with an error naming the adapter). New requests must no longer reach it. The number of
        requests still running when it was removed."""
        deadline = time.monotonic() + self.drain_timeout_s
        while any(v.busy for v in versions) and (left_s := deadline - time.monotonic()) > 0:
            self._finished.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._finished.wait(), left_s)
        ended = sum(version.busy for version in versions)
        if ended:
            log.warning("drain timed out; the adapter's running requests are ended",
                        adapter=record.name, running=ended,
                        drain_timeout_s=self.drain_timeout_s)  # fmt: skip
        for version in versions:
            await self.backend.remove_adapter(version.key)
            self.source.release(version.uri)
            record.forget(version)
        return ended

    def _card(self, version: AdapterVersion) -> ModelDeploymentCard:
        base, name = self._base_card, version.name
        info = LoraInfo(
            name=name, lora_id=version.lora_id, base_model=base.display_name,
            uri=redact_uri(version.uri), local_path=str(version.path), digest=version.digest,
            warnings=version.warnings,
        )  # fmt: skip
        return msgspec.structs.replace(
            base, display_name=name, slug=lora_slug(name), source_path=str(version.path), lora=info
        )


def _mismatch(version: AdapterVersion, *, deleted: bool) -> ConflictError:
    """The error for files whose digest is not the one the load asked for."""
    gone = "; its cached copy was deleted" if deleted else ""
    return ConflictError(
        f"adapter {version.name!r}: expected sha256 {version.expected}, its files have "
        f"{version.digest}{gone} (source {redact_uri(version.uri)}); check the files at the "
        "source, or the sha256 given",
        lora_name=version.name, expected=version.expected, digest=version.digest,
    )  # fmt: skip


async def step(name: str, old: AdapterVersion | None, work: Awaitable[None]) -> None:
    """Run one step of a load; in a swap (``old`` serves) a failure names the step and the
    version that keeps serving, before the cause (a shortened message keeps them). A first
    load's errors read as they always did."""
    try:
        await work
    except LorafleetError as exc:
        if old is not None:
            exc.message = f"swap {name} step failed; {old.digest} keeps serving: {exc.message}"
            exc.args = (exc.message,)
            exc.fields.setdefault("step", name)
        raise


def _settled_digest(path: Path) -> str:
    """``content_digest(path)``, read again while the folder's files are missing for an
    instant (a sharing worker's swap of the cache entry); ``FileNotFoundError`` after
    ``DIGEST_ATTEMPTS`` reads."""
    for _ in range(DIGEST_ATTEMPTS - 1):
        try:
            return content_digest(path)
        except FileNotFoundError:
            time.sleep(DIGEST_RETRY_S)
    return content_digest(path)
