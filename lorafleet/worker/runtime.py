"""Start a worker in the design's order, serve until a signal, then shut down in bounded time.

Start-up is ``WorkerRuntime._start``, one step a line, each fatal: 1. NATS, etcd, lease
(each waited for up to the connect timeout; so are steps 7 and 8, which talk to etcd);
2. subscription confirmed at the server;
3. adapter sources and cache, when LoRA is on (else the LoRA routes say which switch is
missing); 4. status server and its routes; 5. the KV events relay (an engine that
reports its cache), engine start and ``on_endpoint_ready``
exactly once (an adapter engine binds its LoRA controller to the endpoint there);
6. engine routes registered, updates over NATS open; 7. instance record and base card
put; 8. placement follows the fleet's desired state (LoRA on). What a step opens is
undone through the start-up's ``AsyncExitStack``. A signal during start-up stops it at
once. Shutdown: stop taking
requests, finish in-flight ones within the grace period, revoke the lease (which
deletes every record); clean-up gets ``CLEANUP_BUDGET_S`` more, then the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import structlog

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.connect import wait_for_etcd, wait_for_nats
from lorafleet.discovery.keys import instance_key, kv_events_subject, load_key
from lorafleet.discovery.lease import LeaseKeeper
from lorafleet.discovery.nats_connection import WORKER_INBOX_PREFIX, NatsConnection
from lorafleet.discovery.nats_settings import NatsSettings
from lorafleet.discovery.startup import connect_with_retry, unless_stopped
from lorafleet.proto.discovery import Instance, encode_record
from lorafleet.worker import metrics
from lorafleet.worker.adapter_engine import AdapterEngine
from lorafleet.worker.config import WorkerConfig
from lorafleet.worker.endpoint import Endpoint, EndpointAddress
from lorafleet.worker.engine import LLMEngine
from lorafleet.worker.engine_registry import EngineRegistry
from lorafleet.worker.engines import create_engine
from lorafleet.worker.kv_relay import KvRelay
from lorafleet.worker.lora_routes import LORA_PATHS, lora_missing, lora_routes
from lorafleet.worker.placement import Placement
from lorafleet.worker.status_server import StatusServer, StatusState, WorkerPhase, build_status_app
from lorafleet.worker.vllm_models_route import models_route

__all__ = ["WorkerRuntime", "run_worker"]

log = structlog.get_logger(__name__)

T = TypeVar("T")

CLEANUP_BUDGET_S: Final = 2.0
"""After the grace period, clean-up (lease, connections) is cut off after this long;
what it left undone (records in a hung etcd) expires with the lease TTL."""


class WorkerRuntime:
    """One worker process: owns the connections, the endpoint, the engine and the status server."""

    def __init__(self, config: WorkerConfig, engine: LLMEngine | None = None) -> None:
        self.config = config
        self.engine = engine or create_engine(config.engine, config.engine_config)
        self.registry = EngineRegistry()
        self._stop = asyncio.Event()
        self.failure: str | None = None
        """Why the worker stopped on its own (the process then exits 1), or None."""

    def request_stop(self) -> None:
        """Begin a clean shutdown (what SIGTERM and SIGINT do)."""
        self._stop.set()

    def _nats_lost(self) -> None:
        """The NATS connection closed for good: shut down, so the lease and cards go too."""
        self.failure = "the NATS connection closed and cannot be re-made"
        self._stop.set()

    async def run(self) -> None:
        """Start, serve until stopped, shut down; raises if a start-up step fails."""
        deadline = asyncio.timeout(None)
        try:
            async with deadline:
                await self._run(deadline)
        except TimeoutError:
            if not deadline.expired():
                raise
            log.warning("clean-up cut short; records left expire with the lease",
                        budget_s=CLEANUP_BUDGET_S)  # fmt: skip

    async def _run(self, deadline: asyncio.Timeout) -> None:
        """Start unless stopped first, serve, shut down; ``deadline`` bounds the shutdown."""
        loop = asyncio.get_running_loop()
        async with contextlib.AsyncExitStack() as stack:
            started = await unless_stopped(self._start(stack), self._stop)
            if started is None:
                log.info("stopped during start-up")
                deadline.reschedule(loop.time() + CLEANUP_BUDGET_S)
                return
            await self._stop.wait()
            deadline.reschedule(loop.time() + self.config.shutdown_grace_s + CLEANUP_BUDGET_S)
            await self._shutdown(*started)

    async def _start(
        self, stack: contextlib.AsyncExitStack
    ) -> tuple[StatusState, Endpoint, LeaseKeeper, Placement | None]:
        """Start-up, one step a line (see the module docstring); ``stack`` undoes each."""
        nats, etcd = await self._connect(stack)
        lease = await self._grant_lease(etcd, stack)
        endpoint = await self._serve_endpoint(nats, lease)
        status = StatusState(
            self.registry, instance_id=lease.lease_id, auth_token=self.config.auth_token,
            nats=nats, lease=lease,
        )  # fmt: skip
        self._enable_adapters(stack)
        await self._start_status_server(status, stack)
        await self._relay_kv_events(nats, endpoint, stack)
        await self._start_engine(endpoint)
        self._open_updates(status, endpoint)
        await self._until_etcd_answers(lambda: self._publish(lease, endpoint))
        placement = await self._until_etcd_answers(lambda: self._start_placement(etcd, lease))
        status.phase = WorkerPhase.READY
        log.info("worker ready", instance=f"{lease.lease_id:x}", subject=endpoint.address.subject)
        return status, endpoint, lease, placement

    async def _connect(self, stack: contextlib.AsyncExitStack) -> tuple[NatsConnection, EtcdClient]:
        """NATS, then etcd, each waited for up to the connect timeout."""
        cfg = self.config
        nats = await wait_for_nats(
            NatsSettings.from_env(cfg.nats_server), name=f"worker-{os.getpid()}",
            timeout_s=cfg.connect_timeout_s, on_lost=self._nats_lost,
            inbox_prefix=WORKER_INBOX_PREFIX,
        )  # fmt: skip
        stack.push_async_callback(nats.aclose)
        etcd = await wait_for_etcd(cfg.etcd, timeout_s=cfg.connect_timeout_s)
        stack.push_async_callback(etcd.close)
        return nats, etcd

    async def _until_etcd_answers(self, step: Callable[[], Awaitable[T]]) -> T:
        """Run a start-up step that talks to etcd, again on an etcd error, for up to the
        connect timeout: a link that drops after the first connection is waited for too."""
        cfg = self.config
        return await connect_with_retry(
            step, service="etcd", url=cfg.etcd.describe(), timeout_s=cfg.connect_timeout_s,
            check="ETCD_ENDPOINTS (--etcd-endpoints)",
        )  # fmt: skip

    async def _grant_lease(self, etcd: EtcdClient, stack: contextlib.AsyncExitStack) -> LeaseKeeper:
        lease = await LeaseKeeper.grant(etcd, self.config.lease_ttl_s)
        stack.push_async_callback(lease.aclose, revoke=True)
        return lease

    async def _serve_endpoint(self, nats: NatsConnection, lease: LeaseKeeper) -> Endpoint:
        """Subscribe to this instance's subject, confirmed by the server."""
        cfg = self.config
        address = EndpointAddress(
            namespace=cfg.namespace, component=cfg.component,
            endpoint=cfg.endpoint, instance_id=lease.lease_id,
        )  # fmt: skip
        endpoint = Endpoint(nats.client, lease, address, update_token=cfg.auth_token)
        await endpoint.serve()
        metrics.INFLIGHT_REQUESTS.set_function(lambda: endpoint.inflight)  # its one count
        return endpoint

    def _enable_adapters(self, stack: contextlib.AsyncExitStack) -> None:
        """LoRA on: give the engine the adapter sources and cache (``LoRAManager``), whose
        downloads still running at exit are cancelled. LoRA off: say which switch is missing."""
        missing = lora_missing(self.config, self.engine)
        if missing or not isinstance(self.engine, AdapterEngine):
            reason = "LoRA management not available: " + "; ".join(missing)
            self.registry.explain_missing(LORA_PATHS, reason)
            return
        from lorafleet.worker.lora import LoRAManager  # boto3 and friends load only when LoRA is on

        manager = LoRAManager(config=self.config.lora)
        stack.push_async_callback(manager.aclose)
        self.engine.enable_adapters(manager)

    async def _start_status_server(
        self, status: StatusState, stack: contextlib.AsyncExitStack
    ) -> None:
        cfg = self.config
        app = build_status_app(status, [*lora_routes(cfg), models_route(self.engine)])
        server = StatusServer(app, cfg.system_host, cfg.system_port, cfg.header_timeout_s)
        await server.start()
        stack.push_async_callback(server.aclose)

    async def _relay_kv_events(
        self, nats: NatsConnection, endpoint: Endpoint, stack: contextlib.AsyncExitStack
    ) -> None:
        """Relay the engine's KV block events to the fleet, when it reports them."""
        spec = self.engine.kv_cache_spec()
        if spec is None or not spec.events:
            return
        relay = KvRelay.start(
            nats.client, subject=kv_events_subject(self.config.namespace),
            instance_id=endpoint.instance_id, model_name=self.engine.config.model_name,
        )  # fmt: skip
        stack.push_async_callback(relay.aclose)
        self.engine.publish_kv_events(relay.add)
        endpoint.kv_relay = relay

    async def _start_engine(self, endpoint: Endpoint) -> None:
        await self.engine.start()
        endpoint.engine = self.engine
        await self.engine.on_endpoint_ready(endpoint)

    def _open_updates(self, status: StatusState, endpoint: Endpoint) -> None:
        """Register the engine's routes; updates then run over HTTP and NATS alike."""
        self.registry.register(self.engine)
        endpoint.update_handler = status.call

    async def _publish(self, lease: LeaseKeeper, endpoint: Endpoint) -> None:
        cfg, address = self.config, endpoint.address
        instance = Instance(
            namespace=cfg.namespace, component=cfg.component, endpoint=cfg.endpoint,
            instance_id=address.instance_id, subject=address.subject,
            system_url=cfg.system_url, engine=cfg.engine, host=socket.gethostname(),
            pid=os.getpid(), started_at=time.time(), kv_cache=self.engine.kv_cache_spec(),
        )  # fmt: skip
        key = instance_key(cfg.namespace, cfg.component, cfg.endpoint, address.instance_id)
        await lease.put(key, encode_record(instance))
        await endpoint.register_model(self.engine.base_card())

    async def _start_placement(self, etcd: EtcdClient, lease: LeaseKeeper) -> Placement | None:
        """Follow the fleet's desired state when this engine manages adapters."""
        if not isinstance(self.engine, AdapterEngine) or self.engine.lora is None:
            return None
        cfg = self.config
        key = load_key(cfg.namespace, cfg.component, cfg.endpoint, lease.lease_id)
        return await Placement.start(
            etcd, lease, load_key=key, namespace=cfg.namespace, controller=self.engine.lora,
            settings=cfg.placement,
        )  # fmt: skip

    async def _shutdown(
        self,
        status: StatusState,
        endpoint: Endpoint,
        lease: LeaseKeeper,
        placement: Placement | None,
    ) -> None:
        """Refuse new work, finish in-flight requests within the grace, then revoke."""
        log.info("shutting down", grace_s=self.config.shutdown_grace_s)
        status.phase = WorkerPhase.STOPPING
        if placement is not None:
            await placement.aclose()
        await endpoint.stop_accepting()
        await endpoint.drain(self.config.shutdown_grace_s)
        await lease.aclose(revoke=True)  # deletes every record in one revision
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
    if runtime.failure is not None:
        log.error("worker stopped", error=runtime.failure)
        return 1
    return 0
