"""After etcd was SIGKILLed for several lease TTLs, no card is lost once it is back.

gRPC's reconnect backoff used to grow past the TTL, so the keep-alive came back too
late and ``/v1/models`` went empty after etcd's return. The long version (90 s down,
60 s of polling) is in ``tests/chaos/test_etcd_outage.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lorafleet.launch.local_servers import LocalServer
from tests.etcd_scenarios import etcd_outage

pytestmark = pytest.mark.slow

LEASE_TTL_S = 2


async def test_models_stay_listed_after_etcd_returns_from_an_outage_of_several_ttls(
    tmp_path: Path, own_etcd: LocalServer, nats_url: str, namespace: str
) -> None:
    await etcd_outage(
        tmp_path, own_etcd, nats_url, namespace,
        outage_s=5 * LEASE_TTL_S, poll_s=4 * LEASE_TTL_S, lease_ttl_s=LEASE_TTL_S,
    )  # fmt: skip
