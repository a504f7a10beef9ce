"""The prefix index across a NATS outage, long: NATS down 10 s (issue 37)."""

from __future__ import annotations

from pathlib import Path

from lorafleet.discovery.client import EtcdClient
from tests.frontend.kv.test_prefix_routing import check_index_rebuilt_after_nats_outage

OUTAGE_S = 10.0


async def test_a_prefix_frontend_cut_from_nats_10_s_catches_up_and_fails_nothing(
    tmp_path: Path, etcd: EtcdClient, etcd_url: str, namespace: str
) -> None:
    await check_index_rebuilt_after_nats_outage(tmp_path, etcd, etcd_url, namespace, OUTAGE_S)
