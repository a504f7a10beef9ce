"""Issue 14's etcd leader kill at length: five kills of the leader under a minute of chats."""

from __future__ import annotations

from pathlib import Path

from tests.etcd_scenarios import leader_kills_under_load

MAX_FAILED_FRACTION = 0.001


async def test_five_etcd_leader_kills_under_load_lose_no_record_lease_or_request(
    tmp_path: Path, nats_url: str, namespace: str
) -> None:
    load = await leader_kills_under_load(tmp_path, nats_url, namespace, kills=5, load_s=12)
    assert load.sent > 1000
    assert load.failed <= MAX_FAILED_FRACTION * load.sent, load.errors[:5]
