"""End to end: `docker compose up` the real compose.yaml on a private engine and use the cluster.

Run by `make test-compose` (root on Debian 12; installs docker.io and debootstrap when
missing). `make test` does not collect it: the file name does not match `test_*.py`.
The engine's state stays in LORAFLEET_COMPOSE_WORKDIR, so a second run reuses images.
"""

import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from dockerd import DockerEngine, ensure_packages
from standins import build_standins

from tests.etcdctl_output import json_values

WORKDIR: Final = Path(os.environ.get("LORAFLEET_COMPOSE_WORKDIR", "/var/tmp/lorafleet-compose"))
UP_TIMEOUT_S: Final = 1800
PUBLISH_TIMEOUT_S: Final = 30.0
BASE_MODEL: Final = "demo"
ADAPTER: Final = "pirate"
# The demo model as the `adapters` service lays it out (python -m launch.demo_model).
ADAPTER_URI: Final = "file:///data/adapters/demo/adapters/pirate"


@dataclass(frozen=True, kw_only=True)
class Stack:
    """A running compose project and where to reach it from this machine."""

    engine: DockerEngine
    env: dict[str, str]
    frontend_url: str
    worker_url: str

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
    ensure_packages()
    with DockerEngine.start(WORKDIR) as started:
        build_standins(started, WORKDIR)
        yield started


@pytest.fixture(scope="module")
def stack(engine: DockerEngine) -> Iterator[Stack]:
    """The cluster of compose.yaml (no profile), built and healthy; removed with its volumes."""
    frontend_port, worker_port = free_port(), free_port()
    env = {
        "LORAFLEET_HTTP_PORT": str(frontend_port),
        "WORKER_SYSTEM_PORT": str(worker_port),
        "TORCH_INDEX_URL": "",  # torch's CPU wheel comes from the stand-in's local wheels
    }
    running = Stack(
        engine=engine,
        env=env,
        frontend_url=f"http://127.0.0.1:{frontend_port}",
        worker_url=f"http://127.0.0.1:{worker_port}",
    )
    try:
        running.compose("up", "--build", "--wait", "--wait-timeout", str(UP_TIMEOUT_S))
        yield running
    finally:
        logs = engine.compose("logs", "--no-color", env=env, check=False)
        (WORKDIR / "compose.log").write_text(logs)
        print(f"the services' logs are in {WORKDIR / 'compose.log'}")
        engine.compose("down", "--volumes", "--timeout", "30", env=env, check=False)


@pytest.fixture(scope="module")
def loaded_adapter(stack: Stack) -> dict[str, Any]:
    """Load the demo's pirate adapter through the worker's status port; return the reply."""
    body = {"lora_name": ADAPTER, "source": {"uri": ADAPTER_URI}}
    reply = httpx.post(f"{stack.worker_url}/engine/update/load_lora", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    assert result["status"] == "success", result
    return result


def models(stack: Stack) -> dict[str, dict[str, Any]]:
    """Return the frontend's /v1/models by id."""
    reply = httpx.get(f"{stack.frontend_url}/v1/models", timeout=10)
    reply.raise_for_status()
    return {model["id"]: model for model in reply.json()["data"]}


def test_every_service_is_up(stack: Stack) -> None:
    output = stack.compose("ps", "--all", "--format", "json")
    states = [json.loads(line) for line in output.splitlines()]
    by_service = {state["Service"]: state for state in states}
    assert set(by_service) == {"adapters", "etcd", "frontend", "nats", "worker"}
    assert by_service["adapters"]["ExitCode"] == 0
    for service in ("etcd", "frontend", "nats", "worker"):
        assert by_service[service]["Health"] == "healthy", by_service[service]


def test_base_model_is_listed(stack: Stack) -> None:
    assert BASE_MODEL in models(stack)


def test_loaded_adapter_is_listed_with_its_base(
    stack: Stack, loaded_adapter: dict[str, Any]
) -> None:
    deadline = time.monotonic() + PUBLISH_TIMEOUT_S
    while ADAPTER not in (listed := models(stack)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert listed[ADAPTER]["parent"] == BASE_MODEL


def test_adapter_card_is_in_etcd(stack: Stack, loaded_adapter: dict[str, Any]) -> None:
    output = stack.compose(
        "exec", "-T", "etcd", "etcdctl", "get", "--prefix", "v1/mdc/", "--print-value-only"
    )
    cards = json_values(output)
    adapters = [card["lora"] for card in cards if card.get("lora")]
    assert [lora["name"] for lora in adapters] == [ADAPTER]
    assert adapters[0]["lora_id"] == loaded_adapter["lora_id"]


def test_chat_completion_through_adapter(stack: Stack, loaded_adapter: dict[str, Any]) -> None:
    body = {"model": ADAPTER, "messages": [{"role": "user", "content": "Hello!"}]}
    reply = httpx.post(f"{stack.frontend_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    completion = reply.json()
    assert completion["model"] == ADAPTER
    assert completion["choices"][0]["message"]["content"].strip()
    assert completion["usage"]["completion_tokens"] > 0
