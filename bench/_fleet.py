"""Many simulated worker instances in one process, through the worker's own endpoint and LoRA code.

What is real, per instance: its own etcd lease (``LeaseKeeper``, kept alive), its own NATS
subscription on its instance subject (``Endpoint.serve``, answering generate requests with
the mocker engine), its ``Instance`` record and base card, and adapter cards published and
retracted by a ``LoraController`` over the mocker (the worker's load/unload path: lock,
slot, add, publish, roll back). What is simulated: all instances share one NATS connection
and one etcd client (a real worker has one of each); the adapter source resolves every URI
to one placeholder adapter folder (no download, no cache); there is no status server, no placement
loop and no process per instance (start-up steps 1-5 of ``worker.runtime`` are done here,
in the same order, without the status server).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench._cluster import make_adapter_dir
from lorafleet.discovery.client import EtcdClient, connect_etcd
from lorafleet.discovery.keys import instance_key
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.discovery.nats_connection import WORKER_INBOX_PREFIX, NatsConnection
from lorafleet.discovery.nats_settings import NatsSettings
from lorafleet.proto.adapters import LoadLoraRequest, LoraSource, UnloadLoraRequest
from lorafleet.proto.discovery import Instance, encode_record
from lorafleet.worker.endpoint import Endpoint, EndpointAddress
from lorafleet.worker.engine import EngineConfig
from lorafleet.worker.engines.mocker import MockerEngine
from lorafleet.worker.lora_controller import LoraController

__all__ = ["SimulatedFleet", "SimulatedInstance"]

COMPONENT: Final = "backend"
ENDPOINT: Final = "generate"
START_CONCURRENCY: Final = 16
"""Instances started at once (each grants a lease, subscribes and puts two records)."""


class _NoDownload:
    """An ``AdapterSource`` that resolves every ``file://`` URI to one placeholder adapter
    folder inside ``folder``: nothing is downloaded (the worker still digests its files)."""

    def __init__(self, folder: Path) -> None:
        self._folder = make_adapter_dir(folder, "placeholder-adapter")

    def supported_schemes(self) -> frozenset[str]:
        return frozenset({"file"})

    async def acquire(self, uri: str, *, refresh: bool = False) -> Path:
        return self._folder

    def release(self, uri: str) -> None:
        return None

    def forget(self, uri: str) -> bool:
        return False


@dataclass
class SimulatedInstance:
    """One instance: its lease, its endpoint and the mocker engine with its LoRA controller."""

    lease: LeaseKeeper
    endpoint: Endpoint
    engine: MockerEngine

    @property
    def controller(self) -> LoraController:
        """The instance's LoRA lifecycle (created by the engine's ``on_endpoint_ready``)."""
        assert self.engine.lora is not None
        return self.engine.lora

    async def load(self, name: str) -> None:
        """Load adapter ``name`` and publish its card, as ``load_lora`` would."""
        source = LoraSource(uri=f"file:///adapters/{name}")
        await self.controller.load(LoadLoraRequest(lora_name=name, source=source))

    async def unload(self, name: str) -> None:
        """Retract adapter ``name``'s card and remove it, as ``unload_lora`` would."""
        await self.controller.unload(UnloadLoraRequest(lora_name=name))


class SimulatedFleet:
    """``count`` simulated instances of one mocker base model, sharing NATS and etcd clients."""

    def __init__(self, nats: NatsConnection, etcd: EtcdClient) -> None:
        self._nats = nats
        self._etcd = etcd
        self.instances: list[SimulatedInstance] = []

    @classmethod
    async def start(
        cls, *, nats_url: str, etcd_endpoints: str, namespace: str, count: int,
        model: str, max_loras: int, lease_ttl_s: int, folder: Path,
    ) -> SimulatedFleet:  # fmt: skip
        """Connect once, then start ``count`` instances, ``START_CONCURRENCY`` at a time."""
        nats = await NatsConnection.connect(
            NatsSettings.from_env(nats_url), name="bench-fleet", inbox_prefix=WORKER_INBOX_PREFIX
        )
        fleet = cls(nats, await connect_etcd(etcd_endpoints))
        config = EngineConfig(model=model, enable_lora=True, max_loras=max_loras)
        gate = asyncio.Semaphore(START_CONCURRENCY)

        async def one() -> SimulatedInstance:
            async with gate:
                return await fleet._start_instance(namespace, config, lease_ttl_s, folder)

        fleet.instances = list(await asyncio.gather(*(one() for _ in range(count))))
        return fleet

    async def aclose(self) -> None:
        """Revoke every lease (which deletes its records), then close the clients."""
        await asyncio.gather(*(i.lease.aclose(revoke=True) for i in self.instances))
        await asyncio.gather(*(i.endpoint.stop_accepting() for i in self.instances))
        await self._nats.aclose()
        await self._etcd.close()

    async def _start_instance(
        self, namespace: str, config: EngineConfig, lease_ttl_s: int, folder: Path
    ) -> SimulatedInstance:
        """``worker.runtime``'s start-up steps: lease, subscription, engine, records."""
        lease = await LeaseKeeper.grant(self._etcd, lease_ttl_s)
        address = EndpointAddress(
            namespace=namespace, component=COMPONENT, endpoint=ENDPOINT,
            instance_id=lease.lease_id,
        )  # fmt: skip
        endpoint = Endpoint(self._nats.client, lease, address)
        await endpoint.serve()
        engine = MockerEngine(config)
        engine.enable_adapters(_NoDownload(folder))
        await engine.start()
        endpoint.engine = engine
        await engine.on_endpoint_ready(endpoint)
        await lease.put(
            instance_key(namespace, COMPONENT, ENDPOINT, address.instance_id),
            encode_record(_instance_record(address)),
        )
        await endpoint.register_model(engine.base_card())
        return SimulatedInstance(lease=lease, endpoint=endpoint, engine=engine)


def _instance_record(address: EndpointAddress) -> Instance:
    """The record ``worker.runtime`` puts, naming this process."""
    return Instance(
        namespace=address.namespace, component=address.component, endpoint=address.endpoint,
        instance_id=address.instance_id, subject=address.subject,
        engine="mocker", host=socket.gethostname(), pid=os.getpid(), started_at=time.time(),
    )  # fmt: skip
