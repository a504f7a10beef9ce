"""The last failed load of each adapter: the workers' records, and this frontend's on-demand loads.

A worker lists the loads that failed there in its load record until one
succeeds; an on-demand load that failed on every instance is remembered here
for ``FAILED_LOAD_HOLD_S`` (its adapter may have ``replicas: 0``, so no worker
retries it). While a failure *holds* (until the worker's ``retry_at``, and at
least ``FAILED_LOAD_HOLD_S`` after it), requests get that failure at once instead
of waiting for yet another load to fail; after it, the next request tries again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from lorafleet.frontend.fleet_loads import FleetLoads
from lorafleet.proto.adapters import AdapterLoadError
from lorafleet.proto.errors import AdapterRankError, LorafleetError
from lorafleet.proto.fleet_load import LoadFailure
from lorafleet.proto.uris import public_uris_in

__all__ = ["FAILED_LOAD_HOLD_S", "Failure", "LoadFailures", "iso_time"]

FAILED_LOAD_HOLD_S: Final = 30.0
"""How long a failed load answers requests at once when its worker names no ``retry_at``."""


def iso_time(at: float) -> str:
    """``at`` (seconds since the epoch) as ISO 8601 UTC to the second."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


@dataclass(frozen=True, slots=True)
class Failure:
    """One adapter's last failed load and the instance it failed on."""

    instance_id: int
    failure: LoadFailure

    @property
    def hold_until(self) -> float:
        """Until when requests get this failure without a new load (seconds since the epoch):
        the worker's next try, and at least ``FAILED_LOAD_HOLD_S`` after the failure."""
        return max(self.failure.retry_at, self.failure.at + FAILED_LOAD_HOLD_S)

    def describe(self) -> AdapterLoadError:
        """The failure as ``/v1/adapters``, ``/v1/models`` and the 424 show it: readers need
        no token, so URIs are in their public form (no path on a worker's disk)."""
        failure = self.failure
        return AdapterLoadError(
            code=failure.code, message=public_uris_in(failure.message), at=iso_time(failure.at),
            instance=f"{self.instance_id:x}", attempts=failure.attempts,
            retry_at=iso_time(failure.retry_at) if failure.retry_at else None,
        )  # fmt: skip


class LoadFailures:
    """Failed loads by adapter, from the load records and from this frontend's own loads."""

    def __init__(self, loads: FleetLoads) -> None:
        self._loads = loads
        self._own: dict[str, Failure] = {}

    def remember(self, adapter: str, instance_id: int, error: LorafleetError) -> Failure:
        """Note that an on-demand load of ``adapter`` failed everywhere, last on ``instance_id``."""
        previous = self._own.get(adapter)
        now = time.time()
        failure = LoadFailure(
            code=error.code, message=error.message, at=now, retry_at=now + FAILED_LOAD_HOLD_S,
            attempts=previous.failure.attempts + 1 if previous else 1,
        )  # fmt: skip
        self._own[adapter] = Failure(instance_id, failure)
        return self._own[adapter]

    def forget(self, adapter: str) -> None:
        """A load of ``adapter`` succeeded: its own failure no longer counts."""
        self._own.pop(adapter, None)

    def last(self, adapter: str) -> Failure | None:
        """The newest failure of ``adapter`` that a worker lists or this frontend holds. A
        refusal for its rank is the instance's limit, not the adapter's failure: another
        instance may take it, or it is ``unplaceable`` (``frontend.adapter_takers``)."""
        found = [Failure(i, failure) for i, failure in self._loads.failures(adapter).items()
                 if failure.code != AdapterRankError.code]  # fmt: skip
        own = self._own.get(adapter)
        if own is not None and own.hold_until > time.time():
            found.append(own)
        return max(found, key=lambda f: f.failure.at, default=None)

    def holding(self, adapter: str) -> Failure | None:
        """The failure requests for ``adapter`` get now, or None when a load may be tried."""
        last = self.last(adapter)
        return last if last is not None and last.hold_until > time.time() else None
