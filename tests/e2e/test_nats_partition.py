"""NATS partitions, short (issue 27, cases 4 and 5): a 2 + 1 split of the cluster, and the
route between the frontend's server and one worker's held one way.

The scenarios (``tests/nats_partitions.py``) run for longer, several times, in
``tests/chaos/test_nats_partitions.py``. Everything is real: three nats-servers whose routes
pass through proxies, three mocker workers (one per server), etcd and a frontend.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nats_partitions import CUT_OFF, PartitionFigures, partition_fleet, partition_under_load

pytestmark = pytest.mark.slow

HOLD_S = 3.0


def check(figures: PartitionFigures) -> None:
    """What every NATS partition must show: nothing fails that had a healthy path, no
    wrong answer, no stream hangs, what fails says why, and every worker is back."""
    assert figures.failed_with_a_path == 0, figures.errors
    assert figures.wrong == 0, figures.errors
    assert figures.streams_broken == 0, figures.errors
    assert figures.unexplained == 0, figures.errors


async def test_a_2_plus_1_split_fails_only_the_model_with_no_path_and_heals(
    tmp_path: Path, etcd_url: str, namespace: str
) -> None:
    async with partition_fleet(tmp_path, etcd_url=etcd_url, namespace=namespace) as fleet:
        cluster = fleet.cluster
        figures = await partition_under_load(
            fleet, "split", lambda: cluster.isolate(CUT_OFF), hold_s=HOLD_S
        )
    print(figures)
    check(figures)


async def test_a_route_that_drops_the_workers_answers_is_routed_around_until_a_ping_answers(
    tmp_path: Path, etcd_url: str, namespace: str
) -> None:
    """Server 2 hears server 0 but its bytes back are held: requests reach W2, its answers
    and pongs do not come back."""
    async with partition_fleet(tmp_path, etcd_url=etcd_url, namespace=namespace) as fleet:
        link = fleet.cluster.link(0, CUT_OFF)  # upstream: server 2 to server 0
        figures = await partition_under_load(
            fleet, "replies held", lambda: link.hold(downstream=False), hold_s=HOLD_S
        )
    print(figures)
    check(figures)
