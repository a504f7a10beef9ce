"""Errors of the discovery plane.

Hierarchy::

    proto.errors.UnavailableError
    └── EtcdUnavailableError     an etcd call failed or timed out (endpoint, operation, key)
        └── EtcdRefusedError     etcd refused us: credentials, permissions or TLS; permanent

A start-up retry loop retries ``EtcdUnavailableError`` unless ``permanent`` is true:
a wrong password or an unknown CA does not heal by waiting.
"""

from __future__ import annotations

from typing import ClassVar

from proto.errors import UnavailableError

__all__ = ["EtcdRefusedError", "EtcdUnavailableError"]


class EtcdUnavailableError(UnavailableError):
    """etcd could not be reached or did not answer in time; the operation did not happen."""

    permanent: ClassVar[bool] = False
    """Whether retrying the same call can never succeed (see ``EtcdRefusedError``)."""

    def __init__(self, *, endpoint: str, operation: str, key: str = "", reason: str = "") -> None:
        self.endpoint = endpoint
        self.operation = operation
        self.key = key
        where = f" of {key!r}" if key else ""
        super().__init__(
            f"etcd at {endpoint} is unavailable: {operation}{where} failed ({reason}); "
            "check that etcd is running and ETCD_ENDPOINTS points at it"
        )


class EtcdRefusedError(EtcdUnavailableError):
    """etcd answered but refused us (password, role, certificate); retrying cannot help."""

    permanent: ClassVar[bool] = True

    def __init__(self, *, endpoint: str, operation: str, reason: str, check: str) -> None:
        self.endpoint = endpoint
        self.operation = operation
        self.key = ""
        self.check = check
        UnavailableError.__init__(
            self, f"etcd at {endpoint} refused {operation}: {reason}; check {check}"
        )
