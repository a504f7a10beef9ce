"""A multi-host cluster on one machine (issue 27): each group of processes on a host of its own.

Hosts are network namespaces on one switch (``tests.netns.Network``): ``etcd-a``,
``etcd-b``, ``etcd-c`` (one etcd member each), ``nats-a``, ``nats-b``, ``nats-c`` (one
NATS server each, routed into one cluster), ``frontends`` (two frontends) and
``workers-1``, ``workers-2`` (two mocker workers each). The link between any two hosts
can be cut, both ways or one way, so that any two groups can be parted. The test process
reaches every host over the switch's uplink; that link is never cut.

Every worker serves ``demo`` and holds one adapter (``pirate`` or ``poet``), so each
adapter lives on one worker of each group. Must not hold test cases or checks: those are
``tests/chaos/test_topology.py`` and ``tests/invariants.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx

from lorafleet.launch.etcd_cluster import EtcdCluster
from lorafleet.launch.local_servers import LocalServer, find_binary, launch
from lorafleet.launch.processes import (
    ServiceProcess,
    frontend_argv,
    spawn_service,
    stop_services,
    worker_argv,
)
from tests.etcd_scenarios import MODEL, listed_models
from tests.netns import Host, Network
from tests.worker.adapters import make_adapter_dir

ETCD_HOSTS: Final = ("etcd-a", "etcd-b", "etcd-c")
NATS_HOSTS: Final = ("nats-a", "nats-b", "nats-c")
WORKER_HOSTS: Final = ("workers-1", "workers-2")
FRONTENDS: Final = "frontends"
ADAPTERS: Final = ("pirate", "poet")
"""The adapter of a group's first and second worker."""
MODELS: Final = (MODEL, *ADAPTERS)
LEASE_TTL_S: Final = 10
"""The default TTL, for which a lease outlives a client's move off a lost member."""
START_TIMEOUT_S: Final = 120.0
_ETCD_CLIENT_PORT: Final = 2379
_ETCD_PEER_PORT: Final = 2380
_ETCD_METRICS_PORT: Final = 2381
_NATS_PORT: Final = 4222
_NATS_ROUTE_PORT: Final = 6222
_FRONTEND_PORTS: Final = (8000, 8001)
_WORKER_PORTS: Final = (9000, 9001)


@dataclass
class Topology:
    """The running cluster: its network, servers and lorafleet processes."""

    network: Network
    etcd: EtcdCluster
    nats: list[LocalServer]
    frontends: list[ServiceProcess]
    workers: dict[str, list[ServiceProcess]]
    """The workers of each worker host, in the order of ``ADAPTERS``."""
    namespace: str

    def endpoints(self, *first: str) -> str:
        """``ETCD_ENDPOINTS`` listing the members on hosts ``first`` first, then the others."""
        order = [*first, *(host for host in ETCD_HOSTS if host not in first)]
        return ",".join(etcd_url(self.network[host]) for host in order)

    def member(self, host: str) -> LocalServer:
        """The etcd member on ``host``."""
        return self.etcd.members[ETCD_HOSTS.index(host)]

    @property
    def all_workers(self) -> list[ServiceProcess]:
        return [worker for host in WORKER_HOSTS for worker in self.workers[host]]

    def stop(self) -> None:
        """Stop every process and remove the network."""
        stop_services([*self.frontends, *self.all_workers], timeout_s=5)
        for server in self.nats:
            server.stop(kill=True)
        self.etcd.stop()
        self.network.delete()


def create_network() -> Network:
    """The hosts of the cluster on one switch (raises ``OSError`` without root, ip, nft)."""
    return Network.create([*ETCD_HOSTS, *NATS_HOSTS, FRONTENDS, *WORKER_HOSTS])


async def start_topology(network: Network, tmp_path: Path, namespace: str) -> Topology:
    """Start every server and process on ``network`` (from ``create_network``), and wait
    until both frontends list every model; on failure, stop them and delete the network.
    Every client lists ``etcd-a`` first (gRPC stays on it while it answers), so that a
    fault of that member reaches every one of them."""
    topology = Topology(network, EtcdCluster([]), [], [], {h: [] for h in WORKER_HOSTS}, namespace)
    try:
        await asyncio.to_thread(_start_servers, topology, tmp_path)
        await _start_workers(topology, tmp_path)
        await asyncio.to_thread(_start_frontends, topology, tmp_path)
        for frontend in topology.frontends:
            await wait_for_models(frontend, set(MODELS))
    except BaseException:
        topology.stop()
        raise
    return topology


async def wait_for_models(
    frontend: ServiceProcess, models: set[str], timeout_s: float = START_TIMEOUT_S
) -> None:
    """Wait until ``frontend`` lists ``models`` (and no other)."""
    async with httpx.AsyncClient(base_url=frontend.url, timeout=10) as client:
        async with asyncio.timeout(timeout_s):
            while await listed_models(client) != models:
                await asyncio.sleep(0.05)


def _start_servers(topology: Topology, tmp_path: Path) -> None:
    network = topology.network
    topology.etcd.members += start_etcd_members(network, ETCD_HOSTS, tmp_path).members
    routes = ",".join(f"nats://{network[h].address}:{_NATS_ROUTE_PORT}" for h in NATS_HOSTS)
    for host in NATS_HOSTS:
        topology.nats.append(_launch_nats(network[host], routes, tmp_path / host))
    _wait_for(lambda: all(_nats_routed(network[h]) for h in NATS_HOSTS), "NATS routes")


def start_etcd_members(network: Network, hosts: tuple[str, ...], tmp_path: Path) -> EtcdCluster:
    """One etcd member on each of ``hosts``, in one cluster; returns once all are healthy."""
    peers = ",".join(f"{h}=http://{network[h].address}:{_ETCD_PEER_PORT}" for h in hosts)
    cluster = EtcdCluster([_launch_etcd(network[h], peers, tmp_path / h) for h in hosts])
    try:
        _wait_for(lambda: all(_etcd_healthy(m) for m in cluster.members), "etcd members")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def etcd_url(host: Host) -> str:
    """The client URL of the etcd member on ``host``."""
    return f"http://{host.address}:{_ETCD_CLIENT_PORT}"


def _launch_etcd(host: Host, peers: str, data_dir: Path) -> LocalServer:
    url = etcd_url(host)
    peer = f"http://{host.address}:{_ETCD_PEER_PORT}"
    args = host.argv(
        str(find_binary("etcd")), f"--name={host.name}", f"--data-dir={data_dir / 'data'}",
        f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
        f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={peers}", "--initial-cluster-token=lorafleet",
        f"--listen-metrics-urls=http://{host.address}:{_ETCD_METRICS_PORT}", "--log-level=warn",
    )  # fmt: skip
    health = f"http://{host.address}:{_ETCD_METRICS_PORT}"
    return launch(host.name, args, data_dir, url, health_url=health)


def _launch_nats(host: Host, routes: str, data_dir: Path) -> LocalServer:
    args = host.argv(
        str(find_binary("nats-server")), "-a", host.address, "-p", str(_NATS_PORT),
        "--name", host.name, "--cluster_name", "lorafleet", "--routes", routes,
        "--cluster", f"nats://{host.address}:{_NATS_ROUTE_PORT}",
    )  # fmt: skip
    return launch(host.name, args, data_dir, nats_url(host))


def nats_url(host: Host) -> str:
    """The client URL of the NATS server on ``host``."""
    return f"nats://{host.address}:{_NATS_PORT}"


async def _start_workers(topology: Topology, tmp_path: Path) -> None:
    """Start the four workers at once, then load each one's adapter."""
    network = topology.network
    nats = ",".join(nats_url(network[host]) for host in NATS_HOSTS)
    for host in WORKER_HOSTS:
        for port, adapter in zip(_WORKER_PORTS, ADAPTERS, strict=True):
            env = {
                "ETCD_ENDPOINTS": topology.endpoints(), "NATS_SERVER": nats,
                "DYN_LEASE_TTL": str(LEASE_TTL_S), "DYN_LORA_ENABLED": "true",
                "DYN_LORA_PATH": str(tmp_path / f"{host}-{adapter}-cache"),
            }  # fmt: skip
            args = ("--namespace", topology.namespace, "--enable-lora")
            argv = worker_argv(port=port, model=MODEL, host=network[host].address, args=args)
            name = f"{host}-{adapter}"
            topology.workers[host].append(spawn_service(
                name, network[host].argv(*argv), port, env=env,
                log_path=tmp_path / f"{name}.log", host=network[host].address,
            ))  # fmt: skip
    for worker in topology.all_workers:
        await asyncio.to_thread(worker.wait_ready, START_TIMEOUT_S)
    async with httpx.AsyncClient(timeout=60) as client:
        for host in WORKER_HOSTS:
            for worker, adapter in zip(topology.workers[host], ADAPTERS, strict=True):
                uri = f"file://{make_adapter_dir(tmp_path / 'adapters', adapter)}"
                body = {"lora_name": adapter, "source": {"uri": uri}}
                loaded = await client.post(f"{worker.url}/engine/update/load_lora", json=body)
                assert loaded.status_code == 200, loaded.text


def _start_frontends(topology: Topology, tmp_path: Path) -> None:
    host = topology.network[FRONTENDS]
    env = {
        "ETCD_ENDPOINTS": topology.endpoints(),
        "NATS_SERVER": ",".join(nats_url(topology.network[h]) for h in NATS_HOSTS),
    }
    for index, port in enumerate(_FRONTEND_PORTS):
        argv = frontend_argv(port=port, host=host.address,
                             args=("--namespace", topology.namespace))  # fmt: skip
        name = f"frontend-{index + 1}"
        topology.frontends.append(spawn_service(
            name, host.argv(*argv), port, env=env, log_path=tmp_path / f"{name}.log",
            host=host.address,
        ))  # fmt: skip
    for frontend in topology.frontends:
        frontend.wait_ready(START_TIMEOUT_S)


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {START_TIMEOUT_S} s")
        time.sleep(0.1)


def _etcd_healthy(member: LocalServer) -> bool:
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(f"{member.health_url}/health", timeout=1) as reply,
    ):
        return b'"true"' in reply.read()
    return False


def has_leader(member: LocalServer) -> bool:
    """Whether ``member`` says it follows (or is) a leader; True if it does not answer."""
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(f"{member.health_url}/metrics", timeout=1) as reply,
    ):
        return b"\netcd_server_has_leader 1" in reply.read()
    return True


def _nats_routed(host: Host) -> bool:
    """Whether the server on ``host`` advertises all three servers of the cluster."""
    with (
        contextlib.suppress(OSError, ValueError),
        socket.create_connection((host.address, _NATS_PORT), 1) as sock,
    ):
        info = json.loads(sock.makefile("rb").readline().removeprefix(b"INFO ").decode())
        return len(info.get("connect_urls") or []) == len(NATS_HOSTS)
    return False
