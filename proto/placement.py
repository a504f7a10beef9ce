"""Rendezvous (highest random weight) placement of adapters on instances; pure functions.

Every worker and frontend computes the same order from the same inputs, so no
coordinator is needed: when an instance comes or goes, only the adapters that
ranked it among their first ``replicas`` change place.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import blake3

__all__ = ["chosen_instances", "rendezvous_order"]


def _weight(adapter: str, instance_id: int) -> int:
    digest = blake3.blake3(f"{adapter}\x00{instance_id:x}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rendezvous_order(adapter: str, instance_ids: Iterable[int]) -> list[int]:
    """Instances ranked for ``adapter``, best first (ties broken by id)."""
    return sorted(set(instance_ids), key=lambda iid: (_weight(adapter, iid), iid), reverse=True)


def chosen_instances(
    adapter: str, replicas: int | Literal["all"], instance_ids: Iterable[int]
) -> list[int]:
    """The instances that should hold ``adapter``: the first ``replicas`` of its order."""
    order = rendezvous_order(adapter, instance_ids)
    return order if replicas == "all" else order[: max(replicas, 0)]
