"""A frontend or worker started through ``launch.processes`` dies with the process that
started it, even on SIGKILL, whichever way: the kernel's ``PR_SET_PDEATHSIG`` (main
thread) or the child's own parent watch (another thread, or no prctl).

Real processes: a parent Python process spawns a real frontend (waiting for an etcd
that never comes, so it stays up) and is then killed with SIGKILL.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

GONE_WITHIN_S = 5.0
PARENT = textwrap.dedent("""
    import sys, threading
    from pathlib import Path
    from lorafleet.launch.local_servers import free_port
    from lorafleet.launch.processes import frontend_argv, spawn_service

    def spawn():
        port = free_port()
        env = {"ETCD_ENDPOINTS": "http://127.0.0.1:9", "DYN_CONNECT_TIMEOUT_S": "300"}
        pids.append(spawn_service("frontend", frontend_argv(port=port), port, env=env,
                                  log_path=Path(sys.argv[2])).pid)

    pids = []
    if sys.argv[1] == "thread":
        thread = threading.Thread(target=spawn)
        thread.start()
        thread.join()  # the spawning thread is gone: a PDEATHSIG of its would fire now
    else:
        spawn()
    print(pids[0], flush=True)
    sys.stdin.read()
""")


def _running(pid: int) -> bool:
    shown = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return shown.stdout.strip()[:1] not in ("", "Z")


@pytest.mark.parametrize("spawned_from", ["main", "thread"])
def test_a_frontend_dies_with_its_sigkilled_parent(spawned_from: str, tmp_path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, spawned_from, str(tmp_path / "frontend.log")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert _running(child)  # alive while its parent lives (the thread's end kills nothing)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + GONE_WITHIN_S
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)  # not our child: nothing to wait on
        assert not _running(child), (tmp_path / "frontend.log").read_text()
    finally:
        if _running(child):
            subprocess.run(["kill", "-9", str(child)], check=False)
