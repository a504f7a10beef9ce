"""Errors of ``lorafleet`` commands (``up``, ``lora``, ``models``, ``status``).

Hierarchy::

    proto.errors.ConflictError
    ├── PortInUseError        a port ``lorafleet up`` needs is taken (port, holder)
    └── LeftoverClusterError  an earlier ``lorafleet up`` in the state dir still runs
    proto.errors.UnavailableError
    └── ClusterNotReadyError  a process of ``lorafleet up`` died or never became ready

The CLI prints each as one line and exits 1 (a traceback only with ``LOG_LEVEL=debug``).
"""

from __future__ import annotations

from pathlib import Path

from lorafleet.proto.errors import ConflictError, UnavailableError

__all__ = ["ClusterNotReadyError", "LeftoverClusterError", "PortInUseError"]


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


class LeftoverClusterError(ConflictError):
    """Processes of an earlier ``lorafleet up`` in the same state directory still run, and
    nobody said to stop them; nothing was started."""

    def __init__(self, *, state_dir: Path, processes: dict[str, int]) -> None:
        self.state_dir = state_dir
        self.processes = processes
        listed = ", ".join(f"{name} (pid {pid})" for name, pid in processes.items())
        super().__init__(
            f"an earlier lorafleet up in {state_dir} is still running: {listed}; stop it, or "
            "run lorafleet up --replace to stop it first",
            state_dir=str(state_dir),
        )  # fmt: skip


class ClusterNotReadyError(UnavailableError):
    """A process of the local cluster exited or did not answer as its own in time."""
