"""A three-member etcd cluster from the pip-installed binary: killing the leader loses nothing.

Chats run through the frontend while the member everyone is connected to, the leader,
is SIGKILLed: no record, no lease and (aim) no request may be lost. The long version
(more kills, longer load) is in ``tests/chaos/test_etcd_cluster.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from discovery.client import connect_etcd
from discovery.errors import EtcdUnavailableError
from launch.local_servers import free_port
from tests.etcd_scenarios import leader_kills_under_load

pytestmark = pytest.mark.slow

MAX_FAILED_FRACTION = 0.001


async def test_killing_the_etcd_leader_under_load_loses_no_record_lease_or_request(
    tmp_path: Path, nats_url: str, namespace: str
) -> None:
    load = await leader_kills_under_load(tmp_path, nats_url, namespace, kills=1, load_s=4)
    assert load.sent > 50  # the load really ran
    assert load.failed <= MAX_FAILED_FRACTION * load.sent, load.errors[:5]


async def test_a_dead_first_member_is_skipped_and_errors_name_every_endpoint(
    etcd_url: str,
) -> None:
    dead = f"http://localhost:{free_port()}"  # a DNS name, resolved at connect
    etcd = await connect_etcd(f"{dead},{etcd_url}")
    assert await etcd.status()
    await etcd.close()
    also_dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EtcdUnavailableError, match=f"etcd at {dead},{also_dead} is unavailable"):
        await connect_etcd(f"{dead},{also_dead}")
