"""Real lorafleet processes for tests: a worker or frontend wired to the test's etcd and NATS.

Starting, waiting and stopping are ``launch.processes``, shared with the
benchmarks and ``lorafleet up``; this module only adds the test wiring.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lorafleet.launch.local_servers import free_port
from lorafleet.launch.processes import ServiceProcess, frontend_argv, spawn_service, worker_argv

__all__ = ["ServiceProcess", "frontend_start_failure", "start_frontend", "start_worker"]


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
    """Start ``python -m lorafleet.worker`` on a free system port."""
    port = free_port()
    argv = worker_argv(port=port, model=model, args=("--namespace", namespace, *args))
    base_env = {"ETCD_ENDPOINTS": etcd_url, "NATS_SERVER": nats_url, "DYN_LEASE_TTL": "2"}
    return _start(f"worker-{port}", argv, port, log_dir, {**base_env, **(env or {})}, wait)


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
    """Start ``python -m lorafleet.frontend`` on a free HTTP port."""
    port = free_port()
    argv = frontend_argv(port=port, args=("--namespace", namespace, *args))
    base_env = {"ETCD_ENDPOINTS": etcd_url, "NATS_SERVER": nats_url}
    return _start(f"frontend-{port}", argv, port, log_dir, {**base_env, **(env or {})}, wait)


def frontend_start_failure(env: dict[str, str]) -> str:
    """Run ``python -m lorafleet.frontend`` with ``env`` over the test's environment, expecting
    it to fail at start-up: asserts exit 1 and no traceback, and returns its stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "lorafleet.frontend", "--http-port", str(free_port())],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


def _start(
    name: str, argv: list[str], port: int, log_dir: Path, env: dict[str, str], wait: bool
) -> ServiceProcess:
    service = spawn_service(name, argv, port, env=env, log_path=log_dir / f"{name}.log")
    if wait:
        service.wait_ready()
    return service
