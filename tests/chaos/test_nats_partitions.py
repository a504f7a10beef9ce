"""NATS partitions, long (issue 27, cases 4 and 5), several runs each; the figures are in
``docs/faults.md``.

Two frontends, F0 on the majority side and F2 beside W2 (``tests/nats_partitions.py``).
Case 4: W2's server loses both its routes (a 2 + 1 split, connections reset). Case 5: the
route between the frontend's server and W2's is held, both ways, then one way each way
(connections stay open; what is sent arrives when the link returns, as with TCP).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.nats_partitions import (
    CUT_OFF,
    PartitionFleet,
    check,
    partition_fleet,
    partition_under_load,
)

HOLD_S = 10.0
"""How long each partition lasts."""
RUNS = 3


async def test_2_plus_1_splits_fail_only_the_model_with_no_path(
    tmp_path: Path, etcd_url: str, namespace: str
) -> None:
    async with partition_fleet(tmp_path, etcd_url=etcd_url, namespace=namespace) as fleet:
        cluster = fleet.cluster
        for run in range(RUNS):
            figures = await partition_under_load(
                fleet, "split", lambda: cluster.isolate(CUT_OFF), hold_s=HOLD_S
            )
            print(f"run {run}: {figures}")
            check(figures)


def _holds(fleet: PartitionFleet) -> dict[str, Callable[[], None]]:
    link = fleet.cluster.link(0, CUT_OFF)  # upstream: server 2 to server 0
    return {
        "route held both ways": link.hold,
        "replies held (2 to 0)": lambda: link.hold(downstream=False),
        "requests held (0 to 2)": lambda: link.hold(upstream=False),
    }


async def test_a_held_route_to_the_workers_server_is_routed_around_until_a_ping_answers(
    tmp_path: Path, etcd_url: str, namespace: str
) -> None:
    async with partition_fleet(tmp_path, etcd_url=etcd_url, namespace=namespace) as fleet:
        for run in range(2):
            for fault, apply in _holds(fleet).items():
                figures = await partition_under_load(fleet, fault, apply, hold_s=HOLD_S)
                print(f"run {run}: {figures}")
                check(figures)
