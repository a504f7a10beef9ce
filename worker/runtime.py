"""Start a worker in the design's order, serve until a signal, then shut down cleanly.

Start-up (each step fatal): 1. NATS, etcd, lease; 2. subscription confirmed at
the server; 3. engine start and ``on_endpoint_ready`` exactly once; 4. engine
routes registered; 5. instance record and base card put. Shutdown: stop taking
requests, finish in-flight ones within the grace period, delete the cards,
revoke the lease.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import nats
import structlog

from discovery.client import EtcdClient, connect_etcd
from discovery.keys import instance_key
from discovery.lease import LeaseKeeper
from proto.discovery import Instance, encode_record
from worker.adapter_engine import AdapterEngine
from worker.config import WorkerConfig
from worker.endpoint import Endpoint, EndpointAddress
from worker.engine import LLMEngine
from worker.engine_registry import EngineRegistry
from worker.engines import create_engine
from worker.lora_routes import build_lora_support
from worker.placement import Placement
from worker.status_server import StatusServer, StatusState, build_status_app

__all__ = ["WorkerRuntime", "run_worker"]

log = structlog.get_logger(__name__)


class WorkerRuntime:
    """One worker process: owns the connections, the endpoint, the engine and the status server."""

    def __init__(self, config: WorkerConfig, engine: LLMEngine | None = None) -> None:
        self.config = config
        self.engine = engine or create_engine(config.engine, config.engine_config)
        self.registry = EngineRegistry()
        self._stop = asyncio.Event()

    def request_stop(self) -> None:
        """Begin a clean shutdown (what SIGTERM and SIGINT do)."""
        self._stop.set()

    async def run(self) -> None:
        """Start, serve until stopped, shut down; raises if a start-up step fails."""
        cfg = self.config
        nc = await nats.connect(cfg.nats_server, name=f"worker-{os.getpid()}")
        etcd = await connect_etcd(cfg.etcd)
        lease = await LeaseKeeper.grant(etcd, cfg.lease_ttl_s)
        status_server: StatusServer | None = None
        try:
            endpoint = Endpoint(
                nc, lease, self._address(lease.lease_id), update_token=cfg.auth_token
            )
            await endpoint.serve()
            status = StatusState(
                self.registry, instance_id=lease.lease_id, auth_token=cfg.auth_token
            )
            status_server = self._status_server(status)
            await status_server.start()
            await self._start_engine(endpoint)
            self.registry.register(self.engine)
            endpoint.update_handler = self.registry.call
            await self._publish(lease, endpoint)
            placement = await self._start_placement(etcd, lease.lease_id)
            status.ready = True
            log.info(
                "worker ready", instance=f"{lease.lease_id:x}", subject=endpoint.address.subject
            )
            await self._stop.wait()
            if placement is not None:
                await placement.aclose()
            await self._shutdown(endpoint, lease)
        finally:
            if status_server is not None:
                await status_server.aclose()
            await lease.aclose(revoke=True)
            await nc.close()
            await etcd.close()

    def _address(self, instance_id: int) -> EndpointAddress:
        cfg = self.config
        return EndpointAddress(
            namespace=cfg.namespace, component=cfg.component,
            endpoint=cfg.endpoint, instance_id=instance_id,
        )  # fmt: skip

    def _status_server(self, status: StatusState) -> StatusServer:
        lora = build_lora_support(self.config, self.engine, status)
        app = build_status_app(status, lora.routes)
        return StatusServer(app, self.config.system_host, self.config.system_port)

    async def _start_engine(self, endpoint: Endpoint) -> None:
        await self.engine.start()
        endpoint.engine = self.engine
        await self.engine.on_endpoint_ready(endpoint)

    async def _publish(self, lease: LeaseKeeper, endpoint: Endpoint) -> None:
        cfg, address = self.config, endpoint.address
        instance = Instance(
            namespace=cfg.namespace, component=cfg.component, endpoint=cfg.endpoint,
            instance_id=address.instance_id, subject=address.subject,
            system_url=cfg.system_url, engine=cfg.engine, host=socket.gethostname(),
            pid=os.getpid(), started_at=time.time(),
        )  # fmt: skip
        key = instance_key(cfg.namespace, cfg.component, cfg.endpoint, address.instance_id)
        await lease.put(key, encode_record(instance))
        await endpoint.register_model(self.engine.base_card())

    async def _start_placement(self, etcd: EtcdClient, instance_id: int) -> Placement | None:
        """Follow the fleet's desired state when this engine manages adapters."""
        if not isinstance(self.engine, AdapterEngine) or self.engine.lora is None:
            return None
        return await Placement.start(
            etcd, namespace=self.config.namespace, controller=self.engine.lora,
            instance_id=instance_id, base_model=self.engine.config.model_name,
            idle_unload_s=self.config.lora_idle_unload_s,
        )  # fmt: skip

    async def _shutdown(self, endpoint: Endpoint, lease: LeaseKeeper) -> None:
        log.info("shutting down", grace_s=self.config.shutdown_grace_s)
        await endpoint.stop_accepting()
        await endpoint.drain(self.config.shutdown_grace_s)
        for key in lease.records:
            await lease.delete(key)
        await self.engine.stop()


async def run_worker(config: WorkerConfig) -> int:
    """Run a worker until SIGTERM/SIGINT; returns the process exit code."""
    runtime = WorkerRuntime(config)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, runtime.request_stop)
    try:
        await runtime.run()
    except Exception as exc:
        log.error("worker failed", error=str(exc), error_type=type(exc).__name__)
        return 1
    return 0
