"""Errors of the discovery plane.

Hierarchy::

    proto.errors.UnavailableError
    └── EtcdUnavailableError     an etcd call failed or timed out (endpoint, operation, key)
"""

from __future__ import annotations

from proto.errors import UnavailableError

__all__ = ["EtcdUnavailableError"]


class EtcdUnavailableError(UnavailableError):
    """etcd could not be reached or did not answer in time; the operation did not happen."""

    def __init__(self, *, endpoint: str, operation: str, key: str = "", reason: str = "") -> None:
        self.endpoint = endpoint
        self.operation = operation
        self.key = key
        where = f" of {key!r}" if key else ""
        super().__init__(
            f"etcd at {endpoint} is unavailable: {operation}{where} failed ({reason}); "
            "check that etcd is running and ETCD_ENDPOINTS points at it"
        )
