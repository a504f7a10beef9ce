"""A three-member etcd cluster from the pip-installed binary: killing the leader loses nothing.

Chats run through the frontend while the member everyone is connected to, the leader,
is SIGKILLed: no record, no lease and (aim) no request may be lost. The long version
(more kills, longer load) is in ``tests/chaos/test_etcd_cluster.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.etcd_scenarios import leader_kills_under_load

pytestmark = pytest.mark.slow

MAX_FAILED_FRACTION = 0.001


async def test_killing_the_etcd_leader_under_load_loses_no_record_lease_or_request(
    tmp_path: Path, nats_url: str, namespace: str
) -> None:
    load = await leader_kills_under_load(tmp_path, nats_url, namespace, kills=1, load_s=4)
    assert load.sent > 50  # the load really ran
    assert load.failed <= MAX_FAILED_FRACTION * load.sent, load.errors[:5]
