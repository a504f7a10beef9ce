"""NATS faults: the frontend's server of a cluster killed; the scenarios' checks.

``check_nats_outage`` (NATS down) and ``check_nats_node_kill`` (the worker's server killed
under load) run for minutes in ``make test-chaos`` (``tests/chaos/test_nats_faults.py``);
the frontend's node kill has no long form and runs here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lorafleet.launch.local_servers import start_nats, start_nats_cluster
from tests.nats_faults import (
    FAIL_FAST_S,
    RECOVERY_S,
    fleet,
    kill_frontends_nats_server,
    kill_workers_nats_server,
    nats_outage,
)

pytestmark = pytest.mark.slow

MAX_FAILED_SHARE = 0.001
"""Issue 14: at most 0.1% of non-streaming requests may fail when a NATS node dies."""


def check_nats_outage(tmp_path: Path, etcd_url: str, namespace: str, outage_s: float) -> None:
    """The outage scenario with its assertions (shared with the chaos suite)."""
    nats = start_nats(tmp_path / "nats")
    try:
        with fleet(tmp_path, etcd_url=etcd_url, nats_url=nats.url, namespace=namespace) as running:
            figures = nats_outage(running, nats, outage_s=outage_s)
    finally:
        nats.stop()
    print(figures)
    assert not figures.problems
    assert figures.failed_fast > 0
    assert figures.slowest_failure_s < FAIL_FAST_S
    assert figures.first_success_after_return_s < RECOVERY_S


def check_nats_node_kill(
    tmp_path: Path, etcd_url: str, namespace: str, *, clients: int, after_s: float
) -> None:
    """The node-kill scenario with its assertions (shared with the chaos suite)."""
    servers = start_nats_cluster(tmp_path / "nats")
    try:
        urls = ",".join(server.url for server in servers)
        with fleet(
            tmp_path, etcd_url=etcd_url, nats_url=urls, namespace=namespace, workers=2
        ) as running:
            instance = running.worker_health().json()["instance_id"]
            cards = _etcd_keys(etcd_url, f"v1/mdc/{namespace}/")
            figures = kill_workers_nats_server(running, servers, clients=clients, after_s=after_s)
            assert running.worker_health().json()["instance_id"] == instance
            assert _etcd_keys(etcd_url, f"v1/mdc/{namespace}/") == cards
    finally:
        for server in servers:
            server.stop()
    print(figures)
    assert figures.down_s, "the worker never logged its reconnection"
    assert cards
    assert figures.failed <= MAX_FAILED_SHARE * figures.sent, figures.errors[:5]


def _etcd_keys(etcd_url: str, prefix: str) -> list[str]:
    etcdctl = Path(sys.executable).parent / "etcdctl"
    result = subprocess.run(
        [str(etcdctl), "--endpoints", etcd_url, "get", "--prefix", prefix, "--keys-only"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return sorted(line for line in result.stdout.splitlines() if line)


def test_killing_the_frontends_nats_node_loses_no_request_of_a_single_instance(
    tmp_path: Path, etcd_url: str, namespace: str
) -> None:
    """The frontend knows one node (and learns the others from it); the one worker is on
    another. Requests whose replies the frontend's dropped link lost are retried on the same
    instance."""
    servers = start_nats_cluster(tmp_path / "nats")
    try:
        with fleet(
            tmp_path, etcd_url=etcd_url, nats_url=servers[1].url, namespace=namespace,
            frontend_nats_url=servers[0].url,
        ) as running:  # fmt: skip
            figures = kill_frontends_nats_server(running, servers[0], clients=4, after_s=2.0)
    finally:
        for server in servers:
            server.stop()
    print(figures)
    assert figures.down_s, "the frontend never logged its reconnection"
    assert figures.failed <= MAX_FAILED_SHARE * figures.sent, figures.errors[:5]
