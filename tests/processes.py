"""Real lorafleet processes for tests: start a worker or frontend, wait, stop by signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from launch.local_servers import free_port

READY_TIMEOUT_S: Final = 60.0


@dataclass
class ServiceProcess:
    """A worker or frontend subprocess with its HTTP port and log file."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Poll ``/health`` until 200; raise with the log's tail if it dies or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"process exited {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"not ready after {timeout_s}s:\n{self.log_tail()}")

    def wait_for_log(self, text: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Poll the log until ``text`` appears; raise with its tail if the process dies first."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None:
                raise RuntimeError(f"process exited {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {text!r} after {timeout_s}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def terminate(self, timeout_s: float = 15) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, as in a crash."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def start_worker(
    log_dir: Path,
    *,
    etcd_url: str,
    nats_url: str,
    namespace: str,
    model: str = "demo",
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> ServiceProcess:
    """Start ``python -m worker`` on a free system port."""
    port = free_port()
    argv = [
        sys.executable, "-m", "worker", "--model", model, "--namespace", namespace,
        "--system-host", "127.0.0.1", "--system-port", str(port), *args,
    ]  # fmt: skip
    base_env = {"ETCD_ENDPOINTS": etcd_url, "NATS_SERVER": nats_url, "DYN_LEASE_TTL": "2"}
    return _start(argv, log_dir / f"worker-{port}.log", port, {**base_env, **(env or {})}, wait)


def start_frontend(
    log_dir: Path,
    *,
    etcd_url: str,
    nats_url: str,
    namespace: str,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> ServiceProcess:
    """Start ``python -m frontend`` on a free HTTP port."""
    port = free_port()
    argv = [
        sys.executable, "-m", "frontend", "--namespace", namespace,
        "--http-host", "127.0.0.1", "--http-port", str(port), *args,
    ]  # fmt: skip
    base_env = {"ETCD_ENDPOINTS": etcd_url, "NATS_SERVER": nats_url}
    return _start(argv, log_dir / f"frontend-{port}.log", port, {**base_env, **(env or {})}, wait)


def _start(
    argv: list[str], log_path: Path, port: int, env: dict[str, str], wait: bool
) -> ServiceProcess:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
        )  # fmt: skip
    service = ServiceProcess(process, port, log_path, env)
    if wait:
        service.wait_ready()
    return service
