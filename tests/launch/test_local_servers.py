"""Local servers are ours: a port another process already serves is never taken for ours."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorafleet.launch.local_servers import PortTakenError, start_etcd, start_nats


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


def test_servers_on_free_ports_are_started_and_stopped(tmp_path: Path) -> None:
    nats, etcd = start_nats(tmp_path / "nats"), start_etcd(tmp_path / "etcd")
    try:
        assert nats.process.poll() is None and etcd.process.poll() is None
    finally:
        nats.stop()
        etcd.stop()
    assert nats.process.returncode is not None and etcd.process.returncode is not None
