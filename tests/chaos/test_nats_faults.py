"""NATS faults, long: NATS down 150 s (issue 13); the worker's NATS node killed under load (14)."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.test_nats_faults import check_nats_node_kill, check_nats_outage

OUTAGE_S = 150.0
LOAD_AFTER_KILL_S = 30.0


def test_nats_down_150_s_fails_fast_then_every_request_succeeds(
    tmp_path: Path, etcd_url: str, namespace: str
) -> None:
    check_nats_outage(tmp_path, etcd_url, namespace, OUTAGE_S)


def test_killing_the_workers_nats_node_under_heavier_load_loses_nothing(
    tmp_path: Path, etcd_url: str, namespace: str
) -> None:
    check_nats_node_kill(tmp_path, etcd_url, namespace, clients=8, after_s=LOAD_AFTER_KILL_S)
