"""``lorafleet up`` owns its cluster: a taken port stops it first, and the other
commands (``lora``, ``models``, ``status``) find that cluster through its state file.

Real processes throughout: a port holder, ``lorafleet up`` with the mocker engine
(etcd, NATS, a frontend and a worker) and the ``lorafleet`` commands a user types.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from lorafleet.discovery.client import connect_etcd
from lorafleet.discovery.keys import adapters_prefix
from lorafleet.launch.local_servers import free_port
from lorafleet.launch.ports import is_free
from lorafleet.proto.adapters import AdapterSpec, decode_adapter_spec
from tests.launch.test_cluster import STOP_WAIT_S, drain
from tests.worker.adapters import make_adapter_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LORAFLEET = str(Path(sys.executable).parent / "lorafleet")
ETCD_DEFAULT_PORT = 2379
# What the user's shell might set; each test starts from none of it.
CLUSTER_VARIABLES = ("ETCD_ENDPOINTS", "DYN_NAMESPACE", "DYN_HTTP_PORT", "LORAFLEET_STATE_DIR")
HOLD_PORT = (  # binds as servers do (SO_REUSEADDR): closed connections do not hold a port
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
    "print('listening', flush=True); sys.stdin.read()\n"
)


def _user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARIABLES}
    return {**env, "PYTHONUNBUFFERED": "1"}


@contextmanager
def _port_holder(port: int) -> Iterator[subprocess.Popen[str]]:
    """Another process listening on ``port`` until the block ends."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_PORT, str(port)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "listening\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_up_with_its_http_port_taken_exits_1_naming_the_port_and_starts_nothing(
    tmp_path: Path,
) -> None:
    port = free_port()
    with _port_holder(port) as holder:
        argv = [LORAFLEET, "up", "--engine", "mocker", "--http-port", str(port),
                "--system-port", str(free_port())]  # fmt: skip
        result = subprocess.run(argv, cwd=tmp_path, env=_user_env(), capture_output=True,
                                text=True, timeout=60)  # fmt: skip
        assert holder.poll() is None  # the other process is untouched
    assert result.returncode == 1, result
    (line,) = result.stderr.strip().splitlines()
    assert f"port {port} (frontend HTTP) is already in use by pid {holder.pid}" in line
    assert "Traceback" not in result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == []  # no state dir, no etcd data, no cluster.json


def start_up(
    cwd: Path, *flags: str, ports: tuple[int, int], env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``lorafleet up --engine mocker [flags]`` in ``cwd`` on ``ports`` (HTTP, status), once
    it says it is ready; its output is drained from then on."""
    http_port, system_port = ports
    argv = [LORAFLEET, "up", "--engine", "mocker", "--http-port", str(http_port),
            "--system-port", str(system_port), *flags]  # fmt: skip
    up = subprocess.Popen(argv, cwd=cwd, env=_user_env() if env is None else env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    assert up.stdout is not None
    lines = []
    for line in up.stdout:
        lines.append(line)
        if line.startswith("Press Ctrl-C"):
            threading.Thread(target=drain, args=(up.stdout,), daemon=True).start()
            return up
    up.wait()
    raise AssertionError("lorafleet up exited:\n" + "".join(lines[-40:]))


@contextmanager
def running_up(
    cwd: Path,
    *flags: str,
    ports: tuple[int, int] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[tuple[int, int]]:
    """``lorafleet up --engine mocker [flags]`` in ``cwd`` on ``ports`` (HTTP, status; free
    ones by default) until ready; Ctrl-C when the block ends, which must exit 0."""
    ports = ports or (free_port(), free_port())
    up = start_up(cwd, *flags, ports=ports, env=env)
    try:
        yield ports
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(STOP_WAIT_S) == 0


def _lorafleet(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LORAFLEET, *args], cwd=cwd, env=_user_env(), capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_lora_list_after_up_talks_to_that_cluster_when_etcd_moved(tmp_path: Path) -> None:
    with _etcd_default_port_taken(), running_up(tmp_path) as (http_port, system_port):
        state = json.loads((tmp_path / ".lorafleet" / "cluster.json").read_text())
        assert state["etcd_env"]["ETCD_ENDPOINTS"] != f"http://127.0.0.1:{ETCD_DEFAULT_PORT}"
        table = _lorafleet(tmp_path, "lora", "list")
        scripted = _lorafleet(tmp_path, "lora", "list", "--json")
        models = _lorafleet(tmp_path, "models")
        status = _lorafleet(tmp_path, "status")
    worker = f"http://127.0.0.1:{system_port}"
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == ["WORKER", "ADAPTER", "ID"]
    assert table.stdout.splitlines()[1].split()[0] == worker
    assert [json.loads(line)["worker"] for line in scripted.stdout.splitlines()] == [worker]
    assert models.returncode == 0 and "demo" in models.stdout, models
    assert status.returncode == 0, status
    assert state["instance_ids"][0] in status.stdout
    assert f"http://127.0.0.1:{http_port}" in status.stdout
    assert not (tmp_path / ".lorafleet" / "cluster.json").exists()  # removed when it stopped


@contextmanager
def _etcd_default_port_taken() -> Iterator[None]:
    """Hold 2379 unless something else already does: either way etcd must move."""
    if not is_free(ETCD_DEFAULT_PORT):
        yield
        return
    with _port_holder(ETCD_DEFAULT_PORT):
        yield


def test_ctrl_c_during_start_up_prints_one_line_and_leaves_no_process(tmp_path: Path) -> None:
    http_port = free_port()
    argv = [LORAFLEET, "up", "--engine", "mocker", "--http-port", str(http_port),
            "--system-port", str(free_port())]  # fmt: skip
    # started as a script's `lorafleet up &` starts it: with SIGINT ignored, which Python
    # keeps unless told otherwise; the other tests' SIGINT finds the default handler
    up = subprocess.Popen(argv, cwd=tmp_path, env=_user_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          preexec_fn=_ignore_sigint)  # fmt: skip
    assert up.stdout is not None and up.stderr is not None
    for line in up.stdout:  # a child's first line: start-up is under way
        if line.startswith(("[", "Press Ctrl-C")):
            break
    up.send_signal(signal.SIGINT)
    stdout, stderr = up.communicate(timeout=STOP_WAIT_S)
    assert up.returncode == 130
    assert stderr.strip() == "lorafleet: interrupted"
    own = [line for line in stdout.splitlines() if not line.startswith("[")]  # not a child's
    assert not [line for line in own if "Traceback" in line or "KeyboardInterrupt" in line]
    assert not _processes_mentioning(f"--http-port {http_port}", str(tmp_path))


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _processes_mentioning(*needles: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if any(needle in line for needle in needles)]


def test_up_declares_its_adapters_in_the_desired_state_and_passes_engine_options(
    tmp_path: Path,
) -> None:
    sql = make_adapter_dir(tmp_path / "adapters", "sql")
    flags = ("--adapter", f"sql={sql}", "--engine-option", "output_tokens=3")
    with running_up(tmp_path, *flags) as (http_port, _system_port):
        state = json.loads((tmp_path / ".lorafleet" / "cluster.json").read_text())
        declared = asyncio.run(_desired(state["etcd_env"]["ETCD_ENDPOINTS"], state["namespace"]))
        frontend = f"http://127.0.0.1:{http_port}"
        adapter = httpx.get(f"{frontend}/v1/adapters/sql", timeout=10).json()
        body = {"model": "sql", "prompt": "hi", "max_tokens": 10}
        answer = httpx.post(f"{frontend}/v1/completions", json=body, timeout=30).json()
    assert [(spec.name, spec.replicas, spec.source.uri) for spec in declared] == [
        ("sql", "all", f"file://{sql}")
    ]
    assert (adapter["state"], adapter["instances"]) == ("placed", state["instance_ids"])
    assert answer["usage"]["completion_tokens"] == 3  # the worker got --engine-option


async def _desired(etcd_url: str, namespace: str) -> list[AdapterSpec]:
    """The desired state in etcd, as a worker's placement reads it."""
    etcd = await connect_etcd(etcd_url)
    try:
        return [decode_adapter_spec(kv.value) for kv in await etcd.get_prefix(
            adapters_prefix(namespace).encode())]  # fmt: skip
    finally:
        await etcd.close()


def test_up_with_an_adapter_no_worker_can_load_exits_1_with_the_workers_error(
    tmp_path: Path,
) -> None:
    argv = [LORAFLEET, "up", "--engine", "mocker", "--http-port", str(free_port()),
            "--system-port", str(free_port()), "--adapter", "ghost=/no/such/adapter"]  # fmt: skip
    result = subprocess.run(argv, cwd=tmp_path, env=_user_env(), capture_output=True,
                            text=True, timeout=240)  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:]
    assert "loading adapter ghost failed on instance" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
