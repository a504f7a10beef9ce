"""Start local etcd and NATS servers from the pip-installed binaries, on free ports.

Used by the test fixtures, the benchmarks and ``lorafleet up``; no Docker needed.
Each server gets its own data directory and log file and is stopped by PID.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "LocalServer",
    "find_binary",
    "free_port",
    "start_etcd",
    "start_nats",
    "stop_process",
]

START_TIMEOUT_S: Final = 15.0
STOP_TIMEOUT_S: Final = 5.0
_POLL_INTERVAL_S: Final = 0.05


@dataclass
class LocalServer:
    """A running server process: its client URL, data directory and log file."""

    name: str
    url: str
    port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    restart_args: list[str]

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server by PID (SIGTERM, or SIGKILL when ``kill``), waiting for it to exit."""
        stop_process(self.process, kill=kill)

    def restart(self) -> None:
        """Start the server again on the same port with the same data directory."""
        self.stop()
        restarted = _spawn(self.name, self.restart_args, self.data_dir, self.url, _health(self))
        self.process = restarted.process


def stop_process(
    process: subprocess.Popen[bytes], *, kill: bool = False, timeout_s: float = STOP_TIMEOUT_S
) -> None:
    """SIGTERM (or SIGKILL) a child and wait; SIGKILL it if it outlives ``timeout_s``."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout_s)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_binary(name: str) -> Path:
    """Find ``name`` next to this Python (the venv's bin) or on PATH."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return beside_python
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} not found next to {sys.executable} or on PATH; "
            "install the 'servers' extra: pip install 'lorafleet[servers]'"
        )
    return Path(found)


def start_etcd(data_dir: Path, *, port: int | None = None) -> LocalServer:
    """Start etcd with its data in ``data_dir`` and wait until ``/health`` says true."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        str(find_binary("etcd")),
        "--name=lorafleet",
        f"--data-dir={data_dir / 'etcd'}",
        f"--listen-client-urls={url}",
        f"--advertise-client-urls={url}",
        f"--listen-peer-urls=http://127.0.0.1:{free_port()}",
        "--log-level=warn",
    ]
    return _spawn("etcd", args, data_dir, url, _etcd_healthy(url))


def start_nats(data_dir: Path, *, port: int | None = None, jetstream: bool = False) -> LocalServer:
    """Start nats-server and wait until it accepts connections."""
    port = port or free_port()
    args = [str(find_binary("nats-server")), "-a", "127.0.0.1", "-p", str(port)]
    if jetstream:
        args += ["-js", "-sd", str(data_dir / "jetstream")]
    return _spawn("nats", args, data_dir, f"nats://127.0.0.1:{port}", _nats_healthy(port))


def _spawn(
    name: str, args: list[str], data_dir: Path, url: str, healthy: Callable[[], bool]
) -> LocalServer:
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / f"{name}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ},
        )  # fmt: skip
    port = int(url.rsplit(":", 1)[1])
    server = LocalServer(name, url, port, data_dir, log_path, process, args)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not healthy():
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop(kill=True)
            raise RuntimeError(f"{name} did not become healthy at {url}; see {log_path}")
        time.sleep(_POLL_INTERVAL_S)
    return server


def _health(server: LocalServer) -> Callable[[], bool]:
    return _etcd_healthy(server.url) if server.name == "etcd" else _nats_healthy(server.port)


def _etcd_healthy(url: str) -> Callable[[], bool]:
    def check() -> bool:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=1) as r:
            return b'"true"' in r.read()
        return False

    return check


def _nats_healthy(port: int) -> Callable[[], bool]:
    def check() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as s:
            return s.recv(4).startswith(b"INFO")
        return False

    return check
