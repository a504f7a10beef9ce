"""NATS fault scenarios on real processes, each written once and run with the durations given.

``make test-chaos`` runs the outage and the worker's node kill with the issues' durations
(``tests/chaos/test_nats_faults.py``); the main suite runs the frontend's node kill
(``tests/e2e/test_nats_faults.py``). Each returns its figures, printed by the tests and
quoted in ``docs/nats.md``.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
import openai

from lorafleet.launch.local_servers import LocalServer, free_port, nats_cluster_size, start_nats
from tests.faults import TcpProxy
from tests.processes import ServiceProcess, start_frontend, start_worker

MODEL = "nats-demo"
FAIL_FAST_S = 1.0
"""Issue 13: during a NATS outage a request fails in under this long."""
RECOVERY_S = 5.0
"""Issue 13: this long after NATS returns, every request succeeds."""
WAIT_S = 30.0


@dataclass
class Fleet:
    """Mocker workers and one frontend of a namespace, on the NATS servers given."""

    workers: list[ServiceProcess]
    frontend: ServiceProcess

    @property
    def worker(self) -> ServiceProcess:
        """The worker the scenarios watch (and whose NATS server they kill)."""
        return self.workers[0]

    def chat(self, timeout_s: float = 10.0) -> openai.types.chat.ChatCompletion:
        client = openai.OpenAI(
            base_url=f"{self.frontend.url}/v1", api_key="unused", max_retries=0, timeout=timeout_s
        )
        messages = [{"role": "user", "content": "tell me a story"}]
        return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)  # type: ignore[arg-type]

    def worker_health(self) -> httpx.Response:
        return httpx.get(f"{self.worker.url}/health", timeout=5)

    def frontend_health(self) -> httpx.Response:
        return httpx.get(f"{self.frontend.url}/health", timeout=5)


@contextmanager
def fleet(
    log_dir: Path,
    *,
    etcd_url: str,
    nats_url: str,
    namespace: str,
    workers: int = 1,
    worker_env: dict[str, str] | None = None,
    frontend_env: dict[str, str] | None = None,
    frontend_nats_url: str | None = None,
) -> Iterator[Fleet]:
    """Start workers and a frontend, wait until the model answers, stop them all at the end."""
    started: list[ServiceProcess] = []
    try:
        for _ in range(workers):
            started.append(start_worker(
                log_dir, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace,
                model=MODEL, args=("--engine", "mocker"), env=worker_env,
            ))  # fmt: skip
        frontend_url = frontend_nats_url or nats_url
        frontend = start_frontend(log_dir, etcd_url=etcd_url, nats_url=frontend_url,
                                  namespace=namespace, env=frontend_env)  # fmt: skip
        started.append(frontend)
        running = Fleet(started[:workers], frontend)
        _until(lambda: _answers(running), "the model answers through the frontend")
        yield running
    finally:
        for process in reversed(started):
            process.terminate()


def _answers(running: Fleet) -> bool:
    try:
        return bool(running.chat().choices)
    except openai.APIError:
        return False


def _until(condition, what: str, timeout_s: float = WAIT_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s} s for {what}")
        time.sleep(0.02)


@dataclass
class OutageFigures:
    """What a NATS outage looked like to clients."""

    outage_s: float
    failed_fast: int = 0
    slowest_failure_s: float = 0.0
    first_success_after_return_s: float = 0.0
    failures_after_return: int = 0
    successes_after_recovery: int = 0
    problems: list[str] = field(default_factory=list)


def nats_outage(running: Fleet, nats: LocalServer, *, outage_s: float) -> OutageFigures:
    """Kill NATS for ``outage_s``, then restart it on the same port; returns the figures.

    During the outage every request must fail within ``FAIL_FAST_S`` with 503
    ``nats_unavailable`` naming NATS, and the worker's ``/health`` must be 503 naming
    NATS. From ``RECOVERY_S`` after NATS is back, every request must succeed.
    """
    figures = OutageFigures(outage_s=outage_s)
    nats.stop(kill=True)
    _until(lambda: running.frontend_health().status_code == 503, "frontend /health 503")
    _until(lambda: running.worker_health().status_code == 503, "worker /health 503")
    end = time.monotonic() + outage_s
    while time.monotonic() < end:
        _expect_fast_nats_failure(running, figures)
    nats.restart()
    back = time.monotonic()
    _recover(running, figures, back)
    return figures


def _expect_fast_nats_failure(running: Fleet, figures: OutageFigures) -> None:
    started = time.monotonic()
    try:
        running.chat()
        figures.problems.append("a request succeeded while NATS was down")
        return
    except openai.APIStatusError as exc:
        elapsed = time.monotonic() - started
        if exc.status_code != 503 or exc.code != "nats_unavailable" or "NATS" not in exc.message:
            figures.problems.append(f"wrong failure: {exc.status_code} {exc.code} {exc.message}")
    figures.failed_fast += 1
    figures.slowest_failure_s = max(figures.slowest_failure_s, elapsed)
    health = running.worker_health()
    if health.status_code != 503 or "NATS" not in health.json().get("message", ""):
        figures.problems.append(f"worker /health during the outage: {health.text}")


def _recover(running: Fleet, figures: OutageFigures, back: float) -> None:
    """Requests from NATS's return on; from ``RECOVERY_S`` on, each must succeed."""
    successes_needed = 20
    while figures.successes_after_recovery < successes_needed:
        started = time.monotonic()
        try:
            running.chat()
        except openai.APIError as exc:
            if started - back >= RECOVERY_S:
                figures.problems.append(f"failed {started - back:.1f} s after NATS returned: {exc}")
            figures.failures_after_return += 1
            if started - back > WAIT_S:
                return
            continue
        if not figures.first_success_after_return_s:
            figures.first_success_after_return_s = time.monotonic() - back
        figures.successes_after_recovery += 1
    if running.worker_health().status_code != 200:
        figures.problems.append("worker /health is not 200 after NATS returned")


@dataclass
class KillFigures:
    """What killing the worker's NATS server under load looked like."""

    sent: int = 0
    failed: int = 0
    worker_reconnect_s: float = 0.0
    """From the kill until the worker's ``/health`` names another server (polled)."""
    down_s: str = ""
    """What the process on the killed node logged: ``down_s`` of its ``nats reconnected``."""
    errors: list[str] = field(default_factory=list)


class _Load:
    """``clients`` threads sending non-streaming chats until stopped, counting outcomes."""

    def __init__(self, running: Fleet, clients: int) -> None:
        self._running = running
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.figures = KillFigures()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def __enter__(self) -> _Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(WAIT_S)

    def _client(self) -> None:
        while not self._stop.is_set():
            error = None
            try:
                self._running.chat(timeout_s=WAIT_S)
            except openai.APIError as exc:
                error = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.figures.sent += 1
                if error is not None:
                    self.figures.failed += 1
                    self.figures.errors.append(error)


def kill_workers_nats_server(
    running: Fleet, servers: list[LocalServer], *, clients: int, after_s: float
) -> KillFigures:
    """Under load, SIGKILL the NATS server the worker is on; load on for ``after_s`` more."""
    with _Load(running, clients) as load:
        _until(lambda: load.figures.sent >= 20 * clients, "load to run")
        on = running.worker_health().json()["nats_server"]
        victim = next(s for s in servers if on.endswith(f":{s.port}"))
        victim.stop(kill=True)
        killed = time.monotonic()
        _until(lambda: _moved(running, on), "the worker to reconnect elsewhere")
        load.figures.worker_reconnect_s = time.monotonic() - killed
        time.sleep(after_s)  # the scenario's duration under load, not a synchronisation
    load.figures.down_s = _logged_down_s(running.worker)
    return load.figures


def _logged_down_s(process: ServiceProcess) -> str:
    found = re.findall(r"nats reconnected\s+down_s=([0-9.]+)", process.log_path.read_text())
    return found[-1] if found else ""


def _moved(running: Fleet, old_server: str) -> bool:
    body = running.worker_health().json()
    return body.get("nats") == "connected" and body.get("nats_server") != old_server


def kill_frontends_nats_server(
    running: Fleet, victim: LocalServer, *, clients: int, after_s: float
) -> KillFigures:
    """Under load, SIGKILL the NATS server the frontend is on; load on for ``after_s`` more."""
    with _Load(running, clients) as load:
        _until(lambda: load.figures.sent >= 20 * clients, "load to run")
        victim.stop(kill=True)
        time.sleep(after_s)  # the scenario's duration under load, not a synchronisation
    load.figures.down_s = _logged_down_s(running.frontend)
    return load.figures


NOWHERE: Final = "127.0.0.1:1"
"""A cluster URL nothing listens on: what each routed server advertises to the others."""


@dataclass
class RoutedCluster:
    """Three nats-servers in one cluster, each route through a ``TcpProxy``: a route can be
    cut, stalled or held (one way too) while every client's link to its own server stays up.

    Server ``i`` solicits its route to each server ``j < i`` through ``links[i, j]``, whose
    upstream is ``i`` to ``j``. Every server advertises ``NOWHERE`` as its cluster URL, so
    servers that hear of each other by gossip while a route is down cannot route around
    the proxies.
    """

    servers: list[LocalServer]
    links: dict[tuple[int, int], TcpProxy]

    def link(self, a: int, b: int) -> TcpProxy:
        """The proxy of the route between servers ``a`` and ``b``."""
        return self.links[max(a, b), min(a, b)]

    def isolate(self, index: int) -> None:
        """Cut every route of server ``index``: a 2 + 1 split."""
        for pair, proxy in self.links.items():
            if index in pair:
                proxy.cut()

    def restore(self) -> None:
        """Let every route through again."""
        for proxy in self.links.values():
            proxy.restore()

    async def wait_sizes(self, sizes: list[int], timeout_s: float = WAIT_S) -> None:
        """Wait until server ``i`` advertises ``sizes[i]`` servers (itself and its routes)."""
        async with asyncio.timeout(timeout_s):
            while [
                await asyncio.to_thread(nats_cluster_size, s.port) for s in self.servers
            ] != sizes:
                await asyncio.sleep(0.05)

    async def aclose(self) -> None:
        for server in self.servers:
            server.stop(kill=True)
        for proxy in self.links.values():
            await proxy.aclose()


async def start_routed_cluster(data_dir: Path, size: int = 3) -> RoutedCluster:
    """Start ``size`` routed nats-servers (``RoutedCluster``); returns once all routes are up."""
    cluster_ports = [free_port() for _ in range(size)]
    cluster = RoutedCluster([], {})
    try:
        for i in range(size):
            for j in range(i):
                cluster.links[i, j] = await TcpProxy(cluster_ports[j]).start()
        for i, cluster_port in enumerate(cluster_ports):
            args = [
                "--name", f"nats-{i}", "--cluster_name", "lorafleet",
                "--cluster", f"nats://127.0.0.1:{cluster_port}", "--cluster_advertise", NOWHERE,
            ]  # fmt: skip
            if i:
                routes = [f"nats://127.0.0.1:{cluster.links[i, j].port}" for j in range(i)]
                args += ["--routes", ",".join(routes)]
            server = await asyncio.to_thread(
                start_nats, data_dir / f"nats-{i}", extra_args=args, name=f"nats-{i}"
            )
            cluster.servers.append(server)
        await cluster.wait_sizes([size] * size)
    except BaseException:
        await cluster.aclose()
        raise
    return cluster
