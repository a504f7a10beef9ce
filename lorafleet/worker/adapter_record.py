"""One record per adapter name: its versions, each in one phase, and what eviction reads.

The LoRA controller keeps these and nothing else about an adapter: source, digest, lora
id, placement role, pin, requests running and last use all live here, so a feature
touches one place. A version's phase changes only in :meth:`AdapterVersion.enter`,
which logs every change.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from lorafleet.proto.discovery import ModelDeploymentCard

__all__ = ["AdapterRecord", "AdapterVersion", "Phase", "Role"]

log = structlog.get_logger(__name__)


class Phase(enum.Enum):
    """Where one version of an adapter stands, in the order it passes them."""

    FETCHING = "fetching"
    """Its source is being resolved to a local directory and digested; no slot yet."""
    RESERVED = "reserved"
    """It holds an engine slot and waits for the engine to add it."""
    ADDING = "adding"
    """The engine adds its weights."""
    LOADED = "loaded"
    """The engine holds it; its card is not (yet, or any longer) in etcd."""
    PUBLISHED = "published"
    """Its card is in etcd and new requests go to it."""
    DRAINING = "draining"
    """Leaving the engine (a newer version took its requests, or its card was retracted for
    an unload or eviction): new requests no longer reach it, the ones it runs get up to the
    drain timeout to finish before removal."""
    REMOVED = "removed"
    """Gone from the engine; its slot is free."""


SLOT_PHASES = frozenset({Phase.RESERVED, Phase.ADDING, Phase.LOADED, Phase.PUBLISHED,
                         Phase.DRAINING})  # fmt: skip
"""Phases in which a version holds one of the engine's ``max_loras`` slots."""
ARRIVING_PHASES = frozenset({Phase.RESERVED, Phase.ADDING, Phase.LOADED})
"""Phases of a version that took its slot and is on its way to being published."""


class Role(enum.Enum):
    """Why the adapter is on this worker, as placement's plan says."""

    UNMANAGED = "unmanaged"
    """Loaded straight onto the worker (``/v1/loras``, vLLM's routes); no desired state."""
    DECLARED = "declared"
    """In the desired state, not placed here: loaded on a frontend's demand."""
    PLACED = "placed"
    """The fleet-wide plan puts it here: evicted only after the others."""
    DELETED = "deleted"
    """Was in the desired state and is no longer: placement unloads it once idle."""


@dataclass(eq=False)
class AdapterVersion:
    """One set of weights of an adapter: its source, digest, id, engine key and phase."""

    name: str
    uri: str
    expected: str | None = None
    """The digest the load asked for (``source.sha256``); fetching refuses any other."""
    phase: Phase = Phase.FETCHING
    path: Path | None = None
    digest: str = ""
    lora_id: int = 0
    card: ModelDeploymentCard | None = None
    busy: int = 0
    """Requests running on this version now (``LoraController.track``, around the engine's
    ``generate``): the ledger of the one drain (a draining version is removed at 0, or at the
    drain timeout), a busy version is never evicted, and its adapter is not idle. Per version,
    which the endpoint's count (per worker) cannot say; without the engines' request ids,
    which only ``AdapterTable`` holds (to end leftovers)."""
    warnings: list[str] = field(default_factory=list)
    """What fetching let through but the load's answer should say (base model mismatch)."""

    @property
    def key(self) -> str:
        """The engine's handle name: the adapter's name and its digest, so two versions of
        one adapter can be in the engine at once."""
        return f"{self.name}@{self.digest.removeprefix('sha256:')[:12]}"

    @property
    def holds_slot(self) -> bool:
        """Whether this version takes one of the engine's slots now."""
        return self.phase in SLOT_PHASES

    def enter(self, phase: Phase) -> None:
        """Move to ``phase``: the one place a phase changes, logged every time."""
        log.info("adapter version phase", adapter=self.name, digest=self.digest[:19],
                 lora_id=self.lora_id, was=self.phase.value, now=phase.value)  # fmt: skip
        self.phase = phase


@dataclass(eq=False)
class AdapterRecord:
    """Everything the worker knows about one adapter name, whatever version it serves."""

    name: str
    source: str
    """The URI it was last asked to load from; kept after eviction to load it again."""
    versions: list[AdapterVersion] = field(default_factory=list)
    role: Role = Role.UNMANAGED
    pinned: bool = False
    last_used: float = field(default_factory=time.monotonic)
    unserved: bool = True
    """Loaded and no request served since: the requests that waited for it are on their way."""
    last_digest: str = ""
    """The digest of the version last removed (kept for an evicted adapter)."""
    evicted_at: float = 0.0
    """When eviction took it, seconds since the epoch; 0 unless evicted and not loaded since."""
    evicted_reason: str = ""
    """Why eviction took it (which adapter got its slot)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def serving(self) -> AdapterVersion | None:
        """The version new requests go to: the published one, else one loaded and not yet
        (or no longer) published; None when none is."""
        for phase in (Phase.PUBLISHED, Phase.LOADED):
            if live := [version for version in self.versions if version.phase is phase]:
                return live[-1]
        return None

    @property
    def loading(self) -> bool:
        """Whether a version is on its way in (fetching, reserved or adding)."""
        return any(v.phase in (Phase.FETCHING, Phase.RESERVED, Phase.ADDING)
                   for v in self.versions)  # fmt: skip

    @property
    def arriving(self) -> bool:
        """Whether its newest version holds a slot and is not published yet: a load or swap
        past its slot step, which ends (published, or undone) without waiting for a slot or
        another adapter's lock."""
        newest = self.versions[-1] if self.versions else None
        return newest is not None and newest.phase in ARRIVING_PHASES

    @property
    def slots(self) -> int:
        """Engine slots its versions hold now."""
        return sum(1 for version in self.versions if version.holds_slot)

    @property
    def busy(self) -> int:
        """Requests running on any of its versions."""
        return sum(version.busy for version in self.versions)

    @property
    def digest(self) -> str:
        """The digest of the serving version, else of the last one known."""
        serving = self.serving
        if serving is not None:
            return serving.digest
        return self.versions[-1].digest if self.versions else self.last_digest

    def idle_s(self, now: float) -> float:
        """Seconds since it was loaded or last served a request; 0 while busy."""
        return 0.0 if self.busy else now - self.last_used

    def forget(self, version: AdapterVersion) -> None:
        """Drop a removed version, remembering its digest."""
        version.enter(Phase.REMOVED)
        self.versions.remove(version)
        self.last_digest = version.digest
