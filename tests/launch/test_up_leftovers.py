"""``lorafleet up`` leaves nothing behind: killed with SIGKILL its children die with it, and
a later ``up`` in the same state directory stops a live earlier one only when told to.

Real processes throughout: ``lorafleet up`` with the mocker engine (etcd, NATS, a
frontend and a worker), killed and started again as a user (or a CI timeout) would.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lorafleet.launch.local_servers import free_port
from tests.launch.test_cluster import STOP_WAIT_S
from tests.launch.test_up_owns_its_cluster import LORAFLEET, _user_env, running_up, start_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHILDREN_GONE_S = 5.0
"""The issue's bound: no child of a SIGKILLed ``up`` is alive after this long."""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet does not: it holds no port)."""
    shown = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return shown.stdout.strip()[:1] not in ("", "Z")


def _children_left(pids: list[int], within_s: float) -> list[int]:
    """The pids still running once they all ended or ``within_s`` passed (polled: they are
    not our children, so there is nothing to wait on)."""
    deadline = time.monotonic() + within_s
    while (left := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_sigkill_of_up_ends_every_child_and_a_live_up_is_replaced_only_when_told(
    tmp_path: Path,
) -> None:
    """One test for both (each ``up`` costs a cluster's start on a busy CI machine)."""
    ports = (free_port(), free_port())
    killed = start_up(tmp_path, ports=ports)
    state = json.loads((tmp_path / ".lorafleet" / "cluster.json").read_text())
    children = {child["name"]: child["pid"] for child in state["processes"]}
    assert sorted(children) == ["etcd", "frontend", "nats", "worker-0"]
    killed.kill()
    killed.wait()
    assert _children_left(list(children.values()), CHILDREN_GONE_S) == []

    live = start_up(tmp_path, ports=ports)  # same ports, same state dir: nothing in the way
    try:
        refused = _up_in(tmp_path)
        assert refused.returncode == 1, refused
        (line,) = refused.stderr.strip().splitlines()
        assert f"lorafleet up (pid {live.pid})" in line and "--replace" in line
        assert all(f"{name} (pid " in line for name in children)  # its children, by name
        assert live.poll() is None  # untouched
        with running_up(tmp_path, "--replace"):
            assert live.wait(STOP_WAIT_S) == 0  # stopped as by Ctrl-C: in order, cleanly
    finally:
        if live.poll() is None:
            live.send_signal(signal.SIGINT)
            live.wait(STOP_WAIT_S)


def _up_in(cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lorafleet up`` run as a script would (no terminal), on free ports."""
    argv = [LORAFLEET, "up", "--engine", "mocker", "--http-port", str(free_port()),
            "--system-port", str(free_port())]  # fmt: skip
    return subprocess.run(argv, cwd=cwd, env=_user_env(), capture_output=True,
                          stdin=subprocess.DEVNULL, text=True, timeout=60)  # fmt: skip
