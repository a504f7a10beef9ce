"""``lorafleet up`` as a user runs it: every printed line works, Ctrl-C leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from lorafleet.discovery.client import connect_etcd
from lorafleet.launch.demo_model import EXPECTED
from lorafleet.launch.local_servers import free_port, start_etcd

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

READY_LINE = "lorafleet is up. Try:"
STOP_WAIT_S = 120  # lorafleet up bounds its own stop far below; margin for a loaded machine


def _read_until_ready(process: subprocess.Popen[str]) -> list[str]:
    """Output lines up to and including the block of lines to try (pytest-timeout bounds it).

    The rest of the output is drained in the background: a full pipe would block
    ``lorafleet up`` in a print, and it could never stop.
    """
    assert process.stdout is not None
    lines: list[str] = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("Press Ctrl-C"):
            threading.Thread(target=drain, args=(process.stdout,), daemon=True).start()
            return lines
    raise RuntimeError("lorafleet up exited:\n" + "".join(lines[-40:]))


def drain(stream: IO[str]) -> None:
    """Read ``stream`` to its end, dropping what it says."""
    for _ in stream:
        pass


def _suggested_commands(lines: list[str]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.strip() == READY_LINE)
    return [line.strip() for line in lines[start + 1 :] if line.startswith("  ")]


async def test_up_prints_working_lines_and_ctrl_c_leaves_no_process_and_no_key(
    demo, tmp_path: Path, pytestconfig: pytest.Config
):
    env = {**os.environ, "LORAFLEET_HOME": str(pytestconfig.rootpath / ".lorafleet")}
    http_port, system_port = free_port(), free_port()
    argv = [
        str(Path(sys.executable).parent / "lorafleet"), "up", "--http-port", str(http_port),
        "--system-port", str(system_port), "--state-dir", str(tmp_path / "state"),
    ]  # fmt: skip
    up = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        lines = await asyncio.to_thread(_read_until_ready, up)
        commands = _suggested_commands(lines)
        outputs = [await asyncio.to_thread(_run, command) for command in commands]
    finally:
        up.send_signal(signal.SIGINT)
        exit_code = await asyncio.to_thread(up.wait, STOP_WAIT_S)
    assert exit_code == 0
    assert any(EXPECTED["pirate"] in output for output in outputs)
    assert any(EXPECTED["robot"] in output for output in outputs)
    assert any('"display_name": "pirate"' in output for output in outputs)  # the etcdctl line
    fleet = [line.split() for output in outputs for line in output.splitlines()]
    assert ["pirate", "placed", "all", "all"] in [row[:4] for row in fleet]  # lora list: declared
    assert ["robot", "placed", "all", "all"] in [row[:4] for row in fleet]
    assert not _processes_mentioning(
        str(tmp_path), f"--http-port {http_port}", f"--system-port {system_port}"
    )
    await _assert_no_keys_left(tmp_path / "state" / "servers")


def _run(command: str) -> str:
    result = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, (command, result.stderr)
    return result.stdout


def _processes_mentioning(*needles: str) -> list[str]:
    """Running processes whose command line holds one of ``needles`` (the cluster's own)."""
    ps = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if any(needle in line for needle in needles)]


async def _assert_no_keys_left(servers_dir: Path) -> None:
    etcd = start_etcd(servers_dir)  # the same data directory the cluster used
    try:
        client = await connect_etcd(etcd.url)
        assert list(await client.get_prefix(b"v1/")) == []
        await client.close()
    finally:
        etcd.stop()
