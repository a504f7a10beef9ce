"""Fixtures for worker tests: a NATS client and a factory of real worker processes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.processes import ServiceProcess, start_worker


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[nats.aio.client.Client]:
    client = await nats.connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
def worker_factory(
    tmp_path: Path, etcd_url: str, nats_url: str, namespace: str
) -> Iterator[Callable[..., ServiceProcess]]:
    """Start workers in this test's namespace; all are stopped at the end."""
    started: list[ServiceProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, **kwargs: Any) -> ServiceProcess:
        worker = start_worker(
            tmp_path, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace,
            args=args, env=env, **kwargs,
        )  # fmt: skip
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()
