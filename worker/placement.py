"""Fleet placement inside one worker: load what rendezvous hashing gives it, unload the rest.

Each worker watches the desired state (``v1/adapters/{ns}/``) and the base
cards of its peers (``v1/mdc/{ns}/``) and converges by itself; there is no
coordinator. Loads and unloads go through the same ``LoraController`` as the
admin routes (locks, publish, rollback).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

import structlog

from discovery.client import EtcdClient
from discovery.keys import adapters_prefix, card_prefix, parse_card_key
from discovery.watch_cache import WatchCache
from proto.adapters import (
    AdapterSpec,
    LoadLoraRequest,
    UnloadLoraRequest,
    decode_adapter_spec,
)
from proto.discovery import ModelDeploymentCard, decode_card
from proto.errors import LorafleetError
from proto.placement import chosen_instances
from worker.lora_controller import LoraController

__all__ = ["Placement"]

log = structlog.get_logger(__name__)

DEBOUNCE_S: Final = 0.05
RECHECK_S: Final = 5.0
"""Re-run placement this often even without changes: retries failed loads, unloads idle ones."""


class Placement:
    """Keeps this instance's adapters equal to its rendezvous share of the desired state."""

    def __init__(
        self,
        *,
        controller: LoraController,
        instance_id: int,
        base_model: str,
        specs: WatchCache[AdapterSpec],
        cards: WatchCache[ModelDeploymentCard],
        idle_unload_s: float,
    ) -> None:
        self._controller = controller
        self._instance_id = instance_id
        self._base_model = base_model
        self._specs = specs
        self._cards = cards
        self._idle_unload_s = idle_unload_s
        self._placed: set[str] = set()
        self._on_demand: set[str] = set()
        """Loaded here while desired but not placed here: loaded on a frontend's demand."""
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        etcd: EtcdClient,
        *,
        namespace: str,
        controller: LoraController,
        instance_id: int,
        base_model: str,
        idle_unload_s: float,
    ) -> Placement:
        """Watch the desired state and the peers, and converge from now on."""
        specs = await WatchCache.start(etcd, adapters_prefix(namespace), decode_adapter_spec)
        cards = await WatchCache.start(etcd, card_prefix(namespace), decode_card)
        placement = cls(
            controller=controller, instance_id=instance_id, base_model=base_model,
            specs=specs, cards=cards, idle_unload_s=idle_unload_s,
        )  # fmt: skip
        for cache in (specs, cards):
            cache.subscribe(lambda *_: placement._changed.set())
        placement._changed.set()
        placement._task = asyncio.create_task(placement._placement_loop(), name="placement")
        return placement

    async def aclose(self) -> None:
        """Stop converging (adapters stay loaded until the worker stops)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._specs.aclose()
        await self._cards.aclose()

    def peers(self) -> list[int]:
        """Live instances (this one included) that serve the same base model and load adapters."""
        peers = {self._instance_id}
        for key, card in self._cards.items.items():
            same_base = card.lora is None and card.display_name == self._base_model
            if same_base and card.runtime_config.enable_lora:
                peers.add(parse_card_key(key)[1])
        return sorted(peers)

    async def _placement_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), RECHECK_S)
            self._changed.clear()
            await asyncio.sleep(DEBOUNCE_S)
            try:
                await self.reconcile()
            except Exception:
                log.exception("placement pass failed; retrying")

    async def reconcile(self) -> None:
        """One pass: load what this instance is chosen for, unload what it no longer is."""
        specs = {s.name: s for s in self._specs.items.values() if s.base_model == self._base_model}
        peers = self.peers()
        mine = {
            name for name, spec in specs.items()
            if self._instance_id in chosen_instances(name, spec.replicas, peers)
        }  # fmt: skip
        self._controller.pinned = {name for name in mine if specs[name].pinned}
        for name in sorted(mine - self._controller.loaded.keys()):
            await self._load(specs[name])
        self._on_demand &= self._controller.loaded.keys()  # evicted or unloaded meanwhile
        for name in sorted(self._controller.loaded.keys() - mine):
            if name in specs and name not in self._placed:
                self._on_demand.add(name)
            if self._should_unload(name, name in specs):
                await self._unload(name)

    def _should_unload(self, name: str, desired: bool) -> bool:
        idle_s = self._controller.idle_s(name)
        if name in self._placed or (name in self._on_demand and not desired):
            return idle_s > 0  # no longer chosen, or deleted from the desired state: once idle
        return desired and idle_s > self._idle_unload_s  # on demand: keep while recently used

    async def _load(self, spec: AdapterSpec) -> None:
        try:
            await self._controller.load(LoadLoraRequest(lora_name=spec.name, source=spec.source))
        except LorafleetError as exc:
            log.warning("placement could not load adapter", adapter=spec.name, error=exc.message)
            return
        self._placed.add(spec.name)
        log.info("placement loaded adapter", adapter=spec.name)

    async def _unload(self, name: str) -> None:
        try:
            await self._controller.unload(UnloadLoraRequest(lora_name=name))
        except LorafleetError as exc:
            log.warning("placement could not unload adapter", adapter=name, error=exc.message)
            return
        self._placed.discard(name)
        self._on_demand.discard(name)
        log.info("placement unloaded adapter", adapter=name)
