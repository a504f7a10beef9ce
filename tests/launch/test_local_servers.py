"""Local servers are ours: a port another process already serves is never taken for ours."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lorafleet.launch.local_servers import (
    LocalServer,
    PortTakenError,
    free_port,
    start_etcd,
    start_nats,
)


def test_a_nats_server_on_a_port_another_one_serves_fails_instead_of_passing_for_it(
    tmp_path: Path, nats_url: str
) -> None:
    taken = int(nats_url.rsplit(":", 1)[1])
    with pytest.raises(PortTakenError, match="did not become healthy"):
        start_nats(tmp_path / "second", port=taken)


def test_an_etcd_on_a_port_another_one_serves_fails_instead_of_passing_for_it(
    tmp_path: Path, etcd_url: str
) -> None:
    taken = int(etcd_url.rsplit(":", 1)[1])
    with pytest.raises(PortTakenError, match="did not become healthy"):
        start_etcd(tmp_path / "second", port=taken)


@contextmanager
def _connection_from_a_free_port(listening_url: str) -> Iterator[int]:
    """A connection to ``listening_url`` whose local port is a free one, as a client's
    ephemeral port can be the very port ``free_port`` just found free."""
    with socket.socket() as client:
        client.bind(("127.0.0.1", free_port()))
        client.connect(("127.0.0.1", int(listening_url.rsplit(":", 1)[1])))
        yield client.getsockname()[1]


@pytest.mark.parametrize("start", [start_nats, start_etcd], ids=["nats", "etcd"])
def test_a_port_a_connection_holds_is_taken_so_another_is_tried(
    tmp_path: Path, nats_url: str, start: Callable[..., LocalServer]
) -> None:
    with (
        _connection_from_a_free_port(nats_url) as held,
        pytest.raises(PortTakenError, match="did not become healthy"),
    ):
        start(tmp_path / "held", port=held)


def test_servers_on_free_ports_are_started_and_stopped(tmp_path: Path) -> None:
    nats, etcd = start_nats(tmp_path / "nats"), start_etcd(tmp_path / "etcd")
    try:
        assert nats.process.poll() is None and etcd.process.poll() is None
    finally:
        nats.stop()
        etcd.stop()
    assert nats.process.returncode is not None and etcd.process.returncode is not None
