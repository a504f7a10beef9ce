"""The state file of the cluster ``lorafleet up`` runs: where its servers listen.

``lorafleet up`` writes ``<state dir>/cluster.json`` once its processes are ready
and removes it when it stops (a file left by a killed ``up`` names the processes a
later ``up`` must stop first: ``launch.leftovers``); ``lorafleet lora``, ``models``
and ``status`` read it so that they reach that cluster even when etcd or NATS moved to another port.
Flags and environment variables still win over it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import msgspec

from lorafleet.process.pids import pid_alive

__all__ = [
    "ChildProcess",
    "ClusterState",
    "STATE_FILE_NAME",
    "read_recorded_state",
    "read_state",
    "remove_state",
    "write_state",
]

STATE_FILE_NAME: Final = "cluster.json"


class ChildProcess(msgspec.Struct, kw_only=True, frozen=True):
    """One process ``lorafleet up`` started: what a later ``up`` stops if it is left over."""

    name: str
    """As ``up`` prints it: ``etcd``, ``nats``, ``frontend``, ``worker-0``, ..."""
    pid: int
    command: str
    """Its program as ``ps`` showed it once ready; a pid whose command line lacks it was
    reused by another program."""


class ClusterState(msgspec.Struct, kw_only=True, frozen=True):
    """Endpoints of a running local cluster, as ``lorafleet up`` started it."""

    pid: int
    """The ``lorafleet up`` process; a state file whose pid is gone is stale."""
    namespace: str
    frontend_url: str
    worker_urls: list[str]
    nats_url: str
    etcd_env: dict[str, str]
    """The ``ETCD_*`` variables of its etcd (TLS files and user under ``--secure``)."""
    instance_ids: list[str] = msgspec.field(default_factory=list)
    processes: list[ChildProcess] = msgspec.field(default_factory=list)
    """Every process it started (servers first), for ``launch.leftovers``."""


def write_state(state_dir: Path, state: ClusterState) -> Path:
    """Write ``state`` readable by its owner only (it may hold the etcd password)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / STATE_FILE_NAME
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(msgspec.json.encode(state))
    return path


def read_state(state_dir: Path) -> ClusterState | None:
    """The state of a live ``lorafleet up`` in ``state_dir``; None when none runs there."""
    state = read_recorded_state(state_dir)
    return state if state is not None and pid_alive(state.pid) else None


def read_recorded_state(state_dir: Path) -> ClusterState | None:
    """The state file in ``state_dir`` even when its ``lorafleet up`` is gone (a crash, a
    SIGKILL leaves it behind); None when there is none or it cannot be read."""
    try:
        return msgspec.json.decode((state_dir / STATE_FILE_NAME).read_bytes(), type=ClusterState)
    except (OSError, msgspec.DecodeError):
        return None


def remove_state(state_dir: Path) -> None:
    """Remove the state file when the cluster stops."""
    (state_dir / STATE_FILE_NAME).unlink(missing_ok=True)
