"""Start a local etcd cluster of several members from the one pip-installed binary.

For tests and benchmarks of failover: each member is a ``LocalServer`` that can be
killed and started again; the leader is read from each member's metrics.
"""

from __future__ import annotations

import contextlib
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from lorafleet.launch.local_servers import (
    START_TIMEOUT_S,
    LocalServer,
    etcd_member_args,
    free_port,
    launch,
    wait_healthy,
)
from lorafleet.launch.tls_files import TlsFiles

__all__ = ["EtcdCluster", "start_etcd_cluster"]

_LEADER_METRIC: Final = b"\netcd_server_is_leader 1"
_POLL_INTERVAL_S: Final = 0.02


@dataclass
class EtcdCluster:
    """The members of a running cluster, in the order of ``endpoints``."""

    members: list[LocalServer]

    @property
    def endpoints(self) -> str:
        """Every member's client URL, comma-separated, as ``ETCD_ENDPOINTS`` takes them."""
        return ",".join(member.url for member in self.members)

    def leader(self) -> LocalServer | None:
        """The member that is leader now, if any running member says so."""
        for member in self.members:
            if member.process.poll() is None and _is_leader(member):
                return member
        return None

    def wait_for_leader(self, timeout_s: float = START_TIMEOUT_S) -> LocalServer:
        """Wait until some running member is leader and return it."""
        deadline = time.monotonic() + timeout_s
        while (leader := self.leader()) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no etcd leader among {self.endpoints} after {timeout_s} s")
            time.sleep(_POLL_INTERVAL_S)
        return leader

    def stop(self) -> None:
        """Stop every member."""
        for member in self.members:
            member.stop()


def start_etcd_cluster(
    data_dir: Path, *, size: int = 3, tls: TlsFiles | None = None
) -> EtcdCluster:
    """Start ``size`` members on free ports and wait until all are healthy (a leader exists)."""
    ports = [free_port() for _ in range(size)]
    members = [
        launch("etcd", args.args, data_dir / f"member{i}", args.url, health_url=args.health_url)
        for i, args in enumerate(etcd_member_args(data_dir, ports, tls=tls))
    ]
    cluster = EtcdCluster(members)
    try:
        for member in members:
            wait_healthy(member)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _is_leader(member: LocalServer) -> bool:
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(f"{member.health_url}/metrics", timeout=1) as reply,
    ):
        return _LEADER_METRIC in reply.read()
    return False
