"""Fixtures of the frontend tests: an in-process frontend on a real port, stand-in workers,
real mocker workers with LoRA management on."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from litestar import Litestar

from lorafleet.discovery.client import EtcdClient
from lorafleet.discovery.settings import EtcdSettings
from lorafleet.frontend.app import create_app
from lorafleet.frontend.config import FrontendConfig
from lorafleet.frontend.dispatcher import DispatchSettings
from lorafleet.launch.local_servers import free_port
from lorafleet.process.uvicorn_server import UvicornServer
from tests.frontend.stand_in import StandInWorker
from tests.processes import ServiceProcess, start_worker

FAST_DISPATCH = DispatchSettings(stall_s=0.3, ping_timeout_s=0.5)


@dataclass
class RunningFrontend:
    url: str
    app: Litestar
    http: httpx.AsyncClient

    @property
    def registry(self):
        return self.app.state.services.registry


@contextlib.asynccontextmanager
async def run_frontend(config: FrontendConfig) -> AsyncIterator[RunningFrontend]:
    """Serve a frontend app on a free 127.0.0.1 port inside the test's event loop."""
    port = free_port()
    app = create_app(dataclasses.replace(config, http_host="127.0.0.1", http_port=port))
    server = UvicornServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                         access_log=False, lifespan="on"))  # fmt: skip
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task
            raise RuntimeError("frontend did not start")
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        yield RunningFrontend(url=url, app=app, http=http)
    server.should_exit = True
    await task


@pytest.fixture
async def frontend(etcd_url: str, nats_url: str, namespace: str) -> AsyncIterator[RunningFrontend]:
    config = FrontendConfig(namespace=namespace,
                            etcd=EtcdSettings.from_endpoints(etcd_url),
                            nats_server=nats_url,
                            dispatch=FAST_DISPATCH)  # fmt: skip
    async with run_frontend(config) as running:
        yield running


@pytest.fixture
async def workers(
    nats_url: str, etcd: EtcdClient, namespace: str
) -> AsyncIterator[list[StandInWorker]]:
    """A list the test appends started stand-ins to; all are stopped afterwards."""
    started: list[StandInWorker] = []
    yield started
    for worker in started:
        with contextlib.suppress(Exception):
            await worker.stop()


@pytest.fixture
def lora_workers(
    tmp_path: Path, etcd_url: str, nats_url: str, namespace: str
) -> Iterator[Callable[..., list[ServiceProcess]]]:
    """Start ``count`` mocker workers of ``demo`` with LoRA on, in parallel; all are killed."""
    started: list[ServiceProcess] = []

    def start(count: int, *args: str, env: dict[str, str] | None = None) -> list[ServiceProcess]:
        env = {"DYN_LORA_ENABLED": "true", "DYN_LORA_PATH": str(tmp_path / "cache"), **(env or {})}
        argv = ("--engine", "mocker", "--enable-lora", *args)
        where = {"etcd_url": etcd_url, "nats_url": nats_url, "namespace": namespace}
        batch = [
            start_worker(tmp_path, **where, args=argv, env=env, wait=False) for _ in range(count)
        ]
        started.extend(batch)
        for worker in batch:
            worker.wait_ready()
        return batch

    yield start
    for worker in started:
        worker.kill()


async def wait_for_models(frontend: RunningFrontend, names: set[str], timeout_s: float = 5) -> None:
    """Wait until the frontend's registry serves exactly ``names``."""
    async with asyncio.timeout(timeout_s):
        while set(frontend.registry.names()) != names:
            await asyncio.sleep(0.02)
