"""vLLM's load and unload on the frontend, answered as vLLM answers: once done, or the error.

A load declares the adapter for every instance of its base model (``replicas:
"all"``). A new adapter is then loaded on one instance at once, as a request
for it would be (``OnDemandLoader``: least loaded first, evicting an idle
adapter when every slot is taken, which placement alone never does); a reload
to a new source waits until a live instance has the new version's card (the
workers swap), or until every instance that loads adapters has failed to load
it since (their load records say so). A failure puts the desired state back as
it was (a new adapter is deleted, a reload gets its old source back), so bad
input changes nothing. Past ``timeout_s`` the caller answers 202: still loading. A reload
from the source already declared (``load_inplace`` of the same URI) asks every holder to
load it again with ``replace``: an S3 object changed under the same key is fetched anew.

An unload removes a declared adapter from the desired state, and an
unmanaged one (loaded straight onto workers) from every instance that holds
it, over NATS with the workers' token; it waits until their cards are gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

import structlog

from lorafleet.frontend.desired_state import DesiredState
from lorafleet.frontend.dispatcher import DispatchSettings
from lorafleet.frontend.errors import (
    AdapterLoadFailedError,
    InstanceLostError,
    LoadTimeoutError,
    WorkerError,
)
from lorafleet.frontend.fleet_loads import FleetLoads
from lorafleet.frontend.load_failures import Failure
from lorafleet.frontend.on_demand import LOAD_UPDATE, OnDemandLoader
from lorafleet.frontend.registry import ModelRegistry
from lorafleet.frontend.request_plane import RequestPlane
from lorafleet.frontend.worker_updates import send_update
from lorafleet.process.auth import bearer_header
from lorafleet.proto.adapters import (
    AdapterLoadError,
    AdapterSpec,
    LoadLoraRequest,
    UnloadLoraRequest,
)
from lorafleet.proto.discovery import Instance
from lorafleet.proto.errors import ErrorInfo, LorafleetError, NotFoundError, error_from_info
from lorafleet.proto.inference import UpdateRequest
from lorafleet.proto.uris import redact_uri

__all__ = ["LoadOutcome", "LoraWrites", "UNLOAD_UPDATE"]

log = structlog.get_logger(__name__)

_T = TypeVar("_T")

UNLOAD_UPDATE: Final = "update/unload_lora"

LoadOutcome = Literal["loaded", "unchanged", "loading"]
"""``loaded``: a card with the source exists now; ``unchanged``: it already did, and the
desired state already said so; ``loading``: not yet after the wait (answer 202)."""


@dataclass(frozen=True, slots=True)
class _Attempts:
    """Each instance's failed attempts at one adapter, as the load records said before."""

    seen: dict[int, tuple[float, int]]

    def new_on(self, loads: FleetLoads, name: str) -> dict[int, Failure]:
        """Failures recorded since: a new entry, or one with another time or count."""
        return {
            instance_id: Failure(instance_id, failure)
            for instance_id, failure in loads.failures(name).items()
            if self.seen.get(instance_id) != (failure.at, failure.attempts)
        }


class LoraWrites:
    """vLLM's load and unload over the desired state and the workers, with their outcome."""

    def __init__(
        self, registry: ModelRegistry, desired: DesiredState, loads: FleetLoads,
        loader: OnDemandLoader, plane: RequestPlane, *, timeout_s: float,
        settings: DispatchSettings, worker_token: str | None = None,
    ) -> None:  # fmt: skip
        self._registry = registry
        self._desired = desired
        self._loads = loads
        self._loader = loader
        self._plane = plane
        self.timeout_s = timeout_s
        self._settings = settings
        self._headers = bearer_header(worker_token)

    async def load(self, spec: AdapterSpec, *, reload: bool = False) -> LoadOutcome:
        """Declare ``spec`` and wait for its outcome; raises the failure that stopped it
        (after putting the desired state back). With ``reload`` (vLLM's ``load_inplace``) a
        source already declared and served is loaded again by every holder."""
        previous = self._desired.get(spec.name)
        attempts = _Attempts(
            {i: (f.at, f.attempts) for i, f in self._loads.failures(spec.name).items()}
        )
        changed = await self._desired.apply(spec)
        if not changed and self._has_card(spec):
            return await self._reload_holders(spec) if reload else "unchanged"
        try:
            if self._registry.get(spec.name) is None:
                await self._loader.load(spec, retry_failed=True)
                return "loaded"
            failure = await self._swapped_or_failed(spec, attempts)
        except (TimeoutError, LoadTimeoutError):
            log.info("vllm load still running", adapter=spec.name, waited_s=self.timeout_s)
            return "loading"
        except AdapterLoadFailedError as exc:
            failure = exc.failure
        except WorkerError as exc:  # full or starting everywhere: the worker's own code
            await self._restore(spec.name, previous)
            raise exc.error from exc
        except LorafleetError:
            await self._restore(spec.name, previous)
            raise
        if failure is None:
            return "loaded"
        await self._restore(spec.name, previous)
        message = f"loading adapter {spec.name!r} failed on instance {failure.instance}: "
        raise error_from_info(ErrorInfo(code=failure.code, message=message + failure.message))

    async def _swapped_or_failed(
        self, spec: AdapterSpec, attempts: _Attempts
    ) -> AdapterLoadError | None:
        """Wait until a live instance has ``spec``'s card (None) or every instance failed
        to load it since the call (the newest failure, as callers may see it)."""

        def outcome() -> Failure | Literal["loaded"] | None:
            return "loaded" if self._has_card(spec) else self._failed(spec, attempts)

        ended = await self._wait(outcome)
        return ended.describe() if isinstance(ended, Failure) else None

    async def _reload_holders(self, spec: AdapterSpec) -> LoadOutcome:
        """Have every instance holding ``spec`` load its source again (``replace``: a swap
        when the files changed, "nothing changed" when not); raises the first error, once
        all have answered (the others swapped or kept their version). The holders are
        etcd's now, not a moment ago: a copy published just before must not be missed."""
        caches = (self._registry.instance_cache, self._registry.card_cache)
        try:
            await asyncio.gather(*(cache.catch_up(self.timeout_s) for cache in caches))
        except (TimeoutError, LorafleetError) as exc:
            log.warning("reloading the holders seen without catching up with etcd",
                        adapter=spec.name, error=str(exc) or type(exc).__name__)  # fmt: skip
        served = self._registry.get(spec.name)
        holders = served.instances if served is not None else []
        load = LoadLoraRequest(lora_name=spec.name, source=spec.source, replace=True)
        update = UpdateRequest.of(LOAD_UPDATE, load)
        answers = await asyncio.gather(*(self._update_on(i, update) for i in holders))
        errors = [error for error in answers if error is not None]
        log.info("adapter reloaded in place", adapter=spec.name, failed=len(errors),
                 instances=[f"{i.instance_id:x}" for i in holders])  # fmt: skip
        if errors:
            raise errors[0]
        return "loaded"

    async def unload(self, name: str) -> bool:
        """Remove ``name`` from the desired state when declared, then from every instance
        that holds it, and answer once their cards are gone; False when the fleet neither
        declares nor serves it.

        A declared adapter is unloaded from its holders too, not left to placement: a copy a
        frontend loaded on demand before a worker's placement saw the declaration is that
        worker's own (unmanaged) and would outlive the declaration."""
        declared = self._desired.get(name) is not None
        if declared and not await self._desired.delete(name):
            return False
        served = self._registry.get(name)
        if served is None or served.parent is None:
            return declared
        holders = served.instances
        update = UpdateRequest.of(UNLOAD_UPDATE, UnloadLoraRequest(lora_name=name))
        answers = await asyncio.gather(*(self._update_on(instance, update) for instance in holders))
        errors = [error for error in answers if error is not None]
        if errors:
            raise errors[0]
        log.info("adapter unloaded", adapter=name, declared=declared,
                 instances=[f"{i.instance_id:x}" for i in holders])  # fmt: skip
        held = {instance.instance_id for instance in holders}
        try:
            await self._wait(lambda: not (self._holders(name) & held) or None)
        except TimeoutError:
            log.warning("unloaded adapter's cards still show", adapter=name)
        return True

    def _has_card(self, spec: AdapterSpec) -> bool:
        """Whether a live instance has ``spec``'s card, from ``spec``'s source (cards hold
        the URI redacted): a reload to a new source counts once the new version's card is
        there."""
        served = self._registry.get(spec.name)
        if served is None or served.parent is None:
            return False
        source = redact_uri(spec.source.uri)
        return any(
            (card := self._registry.card_on(spec.name, i.instance_id)) is not None
            and card.source == source
            for i in served.instances
        )

    def _failed(self, spec: AdapterSpec, attempts: _Attempts) -> Failure | None:
        """The newest failure once every instance that loads adapters for ``spec``'s base
        model has failed to load it since the call began; None before."""
        candidates = self._candidates(spec.base_model)
        new = attempts.new_on(self._loads, spec.name)
        if not candidates or not candidates <= new.keys():
            return None
        return max(new.values(), key=lambda failure: failure.failure.at)

    def _candidates(self, base_model: str) -> set[int]:
        base = self._registry.get(base_model)
        if base is None or base.parent is not None:
            return set()
        return {
            instance.instance_id
            for instance in base.instances
            if (card := self._registry.card_on(base_model, instance.instance_id)) is not None
            and card.enable_lora
        }

    def _holders(self, name: str) -> set[int]:
        served = self._registry.get(name)
        return {i.instance_id for i in served.instances} if served is not None else set()

    async def _wait(self, done: Callable[[], _T | None]) -> _T:
        """Wait until ``done()`` says something (not None), asked again on every change of
        the cards, instances and load records; raises TimeoutError after ``timeout_s``."""
        changed = asyncio.Event()
        unsubscribe = [
            cache.subscribe(lambda *_: changed.set())
            for cache in (self._registry.card_cache, self._registry.instance_cache,
                          self._loads.cache)
        ]  # fmt: skip
        try:
            async with asyncio.timeout(self.timeout_s):
                while (outcome := done()) is None:
                    await changed.wait()
                    changed.clear()
                return outcome
        finally:
            for stop in unsubscribe:
                stop()

    async def _restore(self, name: str, previous: AdapterSpec | None) -> None:
        """Put the desired state back as it was before a load that failed."""
        if previous is None:
            await self._desired.delete(name)
        else:
            await self._desired.apply(previous)
        log.info("vllm load failed; desired state restored", adapter=name,
                 restored=previous is not None)  # fmt: skip

    async def _update_on(self, instance: Instance, update: UpdateRequest) -> LorafleetError | None:
        """Send ``update`` (a load or unload) to one instance; None when done there, or the
        adapter is gone there (unloaded, or the instance with it)."""
        try:
            answer = await send_update(
                self._plane, instance, update, headers=self._headers, settings=self._settings
            )
        except InstanceLostError:
            return None  # its cards go with its lease
        if answer.error is None or answer.error.code == NotFoundError.code:
            return None
        return error_from_info(answer.error)
