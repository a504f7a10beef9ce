"""Issue 13's long etcd outage: SIGKILLed for 90 s, then 60 s of ``/v1/models`` polling."""

from __future__ import annotations

from pathlib import Path

from lorafleet.launch.local_servers import LocalServer
from tests.etcd_scenarios import etcd_outage


async def test_models_stay_listed_for_a_minute_after_a_90_s_etcd_outage(
    tmp_path: Path, own_etcd: LocalServer, nats_url: str, namespace: str
) -> None:
    await etcd_outage(tmp_path, own_etcd, nats_url, namespace, outage_s=90, poll_s=60)
