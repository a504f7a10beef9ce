"""Errors of the control-plane connections (etcd and NATS).

Hierarchy::

    proto.errors.UnavailableError
    ├── EtcdUnavailableError     an etcd call failed or timed out (endpoint, operation, key)
    │   └── EtcdRefusedError     etcd refused us: credentials, permissions or TLS; permanent
    └── proto.errors.NatsUnavailableError
        └── NatsConnectError     no NATS server of the list took the connection (worth retrying)
            └── NatsAuthError    a server refused the credentials or TLS (permanent)
    proto.errors.LorafleetError, ValueError
    └── NatsSettingsError        a NATS_* variable is malformed or contradicts another (permanent)

A start-up retry loop retries these unless ``permanent`` is true: a wrong password or
an unknown CA does not heal by waiting.
"""

from __future__ import annotations

from typing import ClassVar

from lorafleet.proto.errors import LorafleetError, NatsUnavailableError, UnavailableError

__all__ = [
    "EtcdRefusedError",
    "EtcdUnavailableError",
    "NatsAuthError",
    "NatsConnectError",
    "NatsSettingsError",
]


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


class NatsConnectError(NatsUnavailableError):
    """One connect attempt reached no NATS server of ``NATS_SERVER``; a later one may."""

    permanent: ClassVar[bool] = False
    _WHAT: ClassVar[str] = "is unavailable"

    def __init__(
        self,
        *,
        servers: str,
        reason: str,
        check: str = "that nats-server is running and NATS_SERVER points at it",
    ) -> None:
        self.servers = servers
        self.reason = reason
        self.check = check
        super().__init__(f"NATS at {servers} {self._WHAT} ({reason}); check {check}")


class NatsAuthError(NatsConnectError):
    """A NATS server refused this process's credentials or TLS: retrying cannot help."""

    permanent: ClassVar[bool] = True
    _WHAT: ClassVar[str] = "refused the connection"


class NatsSettingsError(LorafleetError, ValueError):
    """A ``NATS_*`` variable is malformed, names a missing file, or contradicts another."""

    permanent: ClassVar[bool] = True
