"""What an earlier ``lorafleet up`` left running in the same state directory, and stopping it.

``cluster.json`` names the ``lorafleet up`` process and every process it started. A
live ``up`` is asked to stop (SIGTERM: it stops its children in order); a child whose
``up`` is gone (killed where its children could not die with it) is stopped by pid, once
``ps`` shows the command recorded for it, so a reused pid is never signalled. Must not
start anything: ``launch.cluster`` does, once this found nothing left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from lorafleet.launch.cluster_state import ClusterState, read_recorded_state, remove_state
from lorafleet.launch.errors import LeftoverClusterError

__all__ = ["command_line", "stop_leftovers"]

UP_STOP_TIMEOUT_S: Final = 40.0
"""A live ``lorafleet up`` stops its children within its own timeouts (20 s each at most)."""
CHILD_STOP_TIMEOUT_S: Final = 10.0
_POLL_S: Final = 0.1


def stop_leftovers(state_dir: Path, *, replace: bool) -> None:
    """Stop what ``state_dir``'s last ``lorafleet up`` left running: at once with ``replace``,
    after a yes on a terminal; else raise ``LeftoverClusterError`` naming ``--replace``."""
    state = read_recorded_state(state_dir)
    if state is None:
        return
    left = _still_running(state)
    if left and not (replace or _confirmed(state_dir, left)):
        raise LeftoverClusterError(state_dir=state_dir, processes=left)
    if left:
        _stop(state, left)
    remove_state(state_dir)


def _still_running(state: ClusterState) -> dict[str, int]:
    """Name -> pid of the recorded processes that still run as recorded."""
    left = {"lorafleet up": state.pid} if command_line(state.pid) else {}
    for child in state.processes:
        if child.command and child.command in command_line(child.pid):
            left[child.name] = child.pid
    return left


def command_line(pid: int) -> str:
    """``ps``'s view of ``pid``'s command line; "" when it is gone or a zombie (dead, and
    its parent has not reaped it yet)."""
    shown = subprocess.run(
        ["ps", "-o", "stat=,args=", "-p", str(pid)], capture_output=True, text=True
    ).stdout.strip()
    stat, _, args = shown.partition(" ")
    return "" if stat.startswith("Z") else args.strip()


def _confirmed(state_dir: Path, left: dict[str, int]) -> bool:
    """Ask on a terminal whether to stop ``left``; never asks a script (no TTY)."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return False
    listed = ", ".join(f"{name} (pid {pid})" for name, pid in left.items())
    answer = input(f"an earlier lorafleet up in {state_dir} is still running: {listed}. "
                   "Stop it? [y/N] ")  # fmt: skip
    return answer.strip().lower() in {"y", "yes"}


def _stop(state: ClusterState, left: dict[str, int]) -> None:
    """SIGTERM the live ``up`` and wait for it; then SIGTERM, and SIGKILL past the timeout,
    every child still left."""
    if "lorafleet up" in left:
        _signal_and_wait(state.pid, UP_STOP_TIMEOUT_S)
    for name, pid in _still_running(state).items():
        print(f"stopping {name} (pid {pid}) left by an earlier lorafleet up", flush=True)
        _signal_and_wait(pid, CHILD_STOP_TIMEOUT_S)


def _signal_and_wait(pid: int, timeout_s: float) -> None:
    """SIGTERM ``pid``, SIGKILL it past ``timeout_s``, and wait until it is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while command_line(pid) and time.monotonic() < deadline:
            time.sleep(_POLL_S)  # not our child: nothing to wait on but time
        if not command_line(pid):
            return
