"""End to end: `docker compose up` the real compose.yaml on a private engine and use the cluster.

Run by `make test-compose` (root on Debian 12; installs docker.io and debootstrap when
missing, and says so). `make test` does not collect it: the file name does not match
`test_*.py`. The engine's state stays in LORAFLEET_COMPOSE_WORKDIR, so a second run
reuses images; a run holds that folder's lock, and its engine's bridges and iptables
rules are removed when it stops. Each phase prints one line as it starts.
"""

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from compose_cli import REPO
from dockerd import DockerEngine, ensure_packages, phase
from standins import build_standins

from tests.etcdctl_output import json_values

WORKDIR: Final = Path(os.environ.get("LORAFLEET_COMPOSE_WORKDIR", "/var/tmp/lorafleet-compose"))
PUBLISH_TIMEOUT_S: Final = 120.0
BASE_MODEL: Final = "demo"
ADAPTERS: Final = ("pirate", "robot")
WORKERS: Final = 2
TOKEN_FILE: Final = "/data/secrets/admin_token"
"""Where compose.yaml's admin-token job puts the token it generates (no DYN_ADMIN_TOKEN set)."""
# Tests whose shared etcd and NATS come from testcontainers on the private engine.
CONTAINER_TESTS: Final = (
    "tests/discovery/test_lease.py", "tests/discovery/test_watch_cache.py",
    "tests/worker/test_endpoint.py", "tests/worker/test_runtime.py",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Stack:
    """A running compose project and where to reach it from this machine."""

    engine: DockerEngine
    env: dict[str, str]
    frontend_url: str

    def compose(self, *args: str) -> str:
        """Run `docker compose` on this stack and return its stdout."""
        return self.engine.compose(*args, env=self.env)


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def engine() -> Iterator[DockerEngine]:
    """A private Docker engine with the stand-in base images; stopped by PID afterwards."""
    installed = ensure_packages()
    try:
        with DockerEngine.start(WORKDIR) as started:
            phase("building the stand-in base images (etcd, NATS, Python)")
            build_standins(started, WORKDIR)
            yield started
    finally:
        phase(f"installed by this run: {', '.join(installed) or 'nothing'}")


@pytest.fixture(scope="module")
def stack(engine: DockerEngine) -> Iterator[Stack]:
    """The cluster of compose.yaml (no profile) with two workers, built and healthy;
    removed with its volumes."""
    frontend_port = free_port()
    env = {
        "LORAFLEET_HTTP_PORT": str(frontend_port),
        "ETCD_HOST_PORT": str(free_port()),
        "TORCH_INDEX_URL": "",  # torch's CPU wheel comes from the stand-in's local wheels
    }
    running = Stack(engine=engine, env=env, frontend_url=f"http://127.0.0.1:{frontend_port}")
    try:
        phase("docker compose up --build --wait (the README's command; builds the images)")
        running.compose("up", "--build", "--wait")
        phase(f"docker compose up --wait --scale worker={WORKERS}")
        running.compose("up", "--wait", "--scale", f"worker={WORKERS}")
        phase("the stack is up; testing it")
        yield running
    finally:
        phase("docker compose down --volumes")
        logs = engine.compose("logs", "--no-color", env=env, check=False)
        (WORKDIR / "compose.log").write_text(logs)
        print(f"the services' logs are in {WORKDIR / 'compose.log'}")
        engine.compose("down", "--volumes", "--timeout", "30", env=env, check=False)


def models(stack: Stack) -> dict[str, dict[str, Any]]:
    """Return the frontend's /v1/models by id."""
    reply = httpx.get(f"{stack.frontend_url}/v1/models", timeout=10)
    reply.raise_for_status()
    return {model["id"]: model for model in reply.json()["data"]}


def adapter_cards(stack: Stack) -> list[dict[str, Any]]:
    """The `lora` part of every adapter card in etcd."""
    output = stack.compose(
        "exec", "-T", "etcd", "etcdctl", "get", "--prefix", "v1/mdc/", "--print-value-only"
    )
    return [card["lora"] for card in json_values(output) if card.get("lora")]


def test_pirate_answers_right_after_up_wait(stack: Stack) -> None:
    body = {"model": "pirate", "messages": [{"role": "user", "content": "Hello!"}]}
    reply = httpx.post(f"{stack.frontend_url}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    completion = reply.json()
    assert completion["model"] == "pirate"
    assert completion["choices"][0]["message"]["content"].strip()
    assert completion["usage"]["completion_tokens"] > 0


def test_every_service_is_up_with_two_workers(stack: Stack) -> None:
    output = stack.compose("ps", "--all", "--format", "json")
    states = [json.loads(line) for line in output.splitlines()]
    assert sorted(state["Service"] for state in states) == sorted(
        ["adapters", "admin-token", "etcd", "frontend", "nats", *["worker"] * WORKERS]
    )
    for state in states:
        if state["Service"] in ("adapters", "admin-token"):
            assert state["ExitCode"] == 0
        else:
            assert state["Health"] == "healthy", state


def test_the_generated_admin_token_guards_the_fleets_routes(stack: Stack) -> None:
    url = f"{stack.frontend_url}/v1/adapters/no-such-adapter"
    assert httpx.delete(url, timeout=30).status_code == 401
    token = stack.compose("exec", "-T", "frontend", "cat", TOKEN_FILE).strip()
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.delete(url, headers=headers, timeout=30).status_code == 404


def test_the_fleet_loads_both_adapters_on_every_worker(stack: Stack) -> None:
    deadline = time.monotonic() + PUBLISH_TIMEOUT_S
    expected = sorted(name for name in ADAPTERS for _ in range(WORKERS))
    while (names := sorted(c["name"] for c in adapter_cards(stack))) != expected:
        assert time.monotonic() < deadline, names
        time.sleep(1)
    listed = models(stack)
    assert all(listed[name]["parent"] == BASE_MODEL for name in ADAPTERS)


def test_discovery_and_worker_tests_pass_with_servers_from_testcontainers(
    engine: DockerEngine,
) -> None:
    """The LORAFLEET_TEST_CONTAINERS=1 path of tests/conftest.py, on the private engine.

    Ryuk (testcontainers' reaper) is off: its image is not among the stand-ins, and the
    containers are stopped by their own context managers.
    """
    phase(f"the discovery and worker tests through testcontainers: {' '.join(CONTAINER_TESTS)}")
    env = {**engine.env, "LORAFLEET_TEST_CONTAINERS": "1", "TESTCONTAINERS_RYUK_DISABLED": "true"}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *CONTAINER_TESTS]
    result = subprocess.run(command, cwd=REPO, env=env, check=False)
    assert result.returncode == 0
