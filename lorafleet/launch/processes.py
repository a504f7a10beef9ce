"""Start, wait for and stop lorafleet worker and frontend processes: the one way to do it.

``lorafleet up``, the benchmarks and the tests all use these helpers, so a
change to how a process is started or judged ready is made once. The etcd and
NATS servers themselves live in ``launch.local_servers``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from lorafleet.launch.local_servers import stop_process
from lorafleet.process.parent_death import die_with_parent, parent_pid_env

__all__ = [
    "ServiceProcess",
    "frontend_argv",
    "spawn_service",
    "stop_services",
    "worker_argv",
]

READY_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 15.0
_POLL_INTERVAL_S: Final = 0.05
_HEALTH_TIMEOUT_S: Final = 2.0


@dataclass
class ServiceProcess:
    """A worker or frontend child: its HTTP port and where its output goes.

    ``log_path`` is None when the output is echoed to our stdout, prefixed by
    ``name`` (``lorafleet up``); then ``log_tail`` has nothing to show.
    """

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path | None
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    """The address its HTTP server listens on (another host's, in a network namespace)."""

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    @property
    def url(self) -> str:
        """Base URL of its HTTP server (frontend API or worker status server)."""
        return f"http://{self.host}:{self.port}"

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict[str, object]:
        """Poll ``/health`` until 200 and return its JSON; raise with the log's tail otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._raise_if_exited()
            health = _health(self.url)
            if health is not None:
                return health
            time.sleep(_POLL_INTERVAL_S)
        raise TimeoutError(f"{self.name} not ready after {timeout_s}s:\n{self.log_tail()}")

    def wait_for_log(self, text: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Poll the log until ``text`` appears; raise with its tail if the process dies first."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log_text():
            self._raise_if_exited()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {text!r} from {self.name} after {timeout_s}s")
            time.sleep(_POLL_INTERVAL_S)

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait (no SIGKILL: a hang is the caller's failure); return the exit code."""
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(timeout_s)

    def stop(self, *, kill: bool = False, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (or SIGKILL) and wait; SIGKILL it if it outlives ``timeout_s``."""
        stop_process(self.process, kill=kill, timeout_s=timeout_s)

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, as in a crash."""
        self.stop(kill=True)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of its log (empty when its output is echoed instead)."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def log_text(self) -> str:
        """Its whole log (empty when its output is echoed instead)."""
        return "" if self.log_path is None else self.log_path.read_text(errors="replace")

    def _raise_if_exited(self) -> None:
        if self.process.poll() is not None:
            code = self.process.returncode
            raise RuntimeError(f"{self.name} exited {code}:\n{self.log_tail()}")


def worker_argv(
    *, port: int, model: str, engine: str | None = None, host: str = "127.0.0.1",
    args: Iterable[str] = (),
) -> list[str]:  # fmt: skip
    """``python -m lorafleet.worker`` serving ``model``, its status server on ``host``:``port``."""
    engine_args = [] if engine is None else ["--engine", engine]
    return [
        sys.executable, "-m", "lorafleet.worker", *engine_args, "--model", model,
        "--system-host", host, "--system-port", str(port), *args,
    ]  # fmt: skip


def frontend_argv(
    *, port: int, host: str | None = "127.0.0.1", args: Iterable[str] = ()
) -> list[str]:
    """``python -m lorafleet.frontend``, its HTTP API on ``host``:``port`` (None: its default)."""
    host_args = [] if host is None else ["--http-host", host]
    return [sys.executable, "-m", "lorafleet.frontend", *host_args, "--http-port", str(port), *args]


def spawn_service(
    name: str, argv: list[str], port: int, *, env: dict[str, str], log_path: Path | None,
    host: str = "127.0.0.1",
) -> ServiceProcess:  # fmt: skip
    """Start ``argv`` with ``env`` over ours; output to ``log_path``, or echoed when None.
    ``host`` is where its HTTP server listens.

    The child gets its own session, so a Ctrl-C in the terminal reaches only
    us and we stop our children in order; it dies with us even when we are
    SIGKILLed (``process.parent_death``: start it from the main thread).
    """
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    if log_path is None:
        process = _popen(argv, full_env, subprocess.PIPE)
        assert process.stdout is not None
        threading.Thread(target=_echo_lines, args=(name, process.stdout), daemon=True).start()
    else:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            process = _popen(argv, full_env, log)
    return ServiceProcess(name, process, port, log_path, env, host)


def stop_services(services: Iterable[ServiceProcess], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM every service first, then wait for each (SIGKILL after ``timeout_s``)."""
    running = [service for service in services if service.process.poll() is None]
    for service in running:
        service.process.terminate()
    for service in running:
        service.stop(timeout_s=timeout_s)


def _popen(
    argv: list[str], env: dict[str, str], stdout: int | IO[bytes]
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        die_with_parent(argv), stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**env, **parent_pid_env()}, start_new_session=True,
    )  # fmt: skip


def _health(url: str) -> dict[str, object] | None:
    """``/health``'s JSON when it answers 200, else None."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=_HEALTH_TIMEOUT_S) as response:
            body = response.read() if response.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None
    if body is None:
        return None
    try:
        return dict(json.loads(body))
    except ValueError:
        return {}


def _echo_lines(name: str, stream: IO[bytes]) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"[{name:>9}] {line.decode(errors='replace')}")
        sys.stdout.flush()
