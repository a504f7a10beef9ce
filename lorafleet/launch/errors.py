"""Errors of ``lorafleet`` commands (``up``, ``lora``, ``models``, ``status``).

Hierarchy::

    proto.errors.ConflictError
    └── PortInUseError        a port ``lorafleet up`` needs is taken (port, holder)
    proto.errors.UnavailableError
    └── ClusterNotReadyError  a process of ``lorafleet up`` died or never became ready

The CLI prints each as one line and exits 1 (a traceback only with ``LOG_LEVEL=debug``).
"""

from __future__ import annotations

from lorafleet.proto.errors import ConflictError, UnavailableError

__all__ = ["ClusterNotReadyError", "PortInUseError"]


class PortInUseError(ConflictError):
    """A port ``lorafleet up`` would listen on is already taken; nothing was started."""

    def __init__(self, *, port: int, role: str, holder: str = "") -> None:
        self.port = port
        self.role = role
        held = f" by {holder}" if holder else " by another process"
        super().__init__(
            f"port {port} ({role}) is already in use{held}; stop it or pick another port "
            "(lorafleet up --help lists the port flags)",
            port=port, role=role,
        )  # fmt: skip


class ClusterNotReadyError(UnavailableError):
    """A process of the local cluster exited or did not answer as its own in time."""
