"""``python -m lorafleet.frontend`` as operators run it: signals, start-up waits, stuck clients."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from lorafleet.launch.local_servers import free_port
from tests.processes import ServiceProcess, start_frontend
from tests.stuck_clients import (
    EXIT_MARGIN_S,
    closed_by_server,
    exits_within_grace_despite_stuck_clients_and_hung_etcd,
    served_after,
    stop_by_signal,
)


def _frontend(
    tmp_path: Path, etcd_url: str, nats_url: str, namespace: str, *args: str, wait: bool = True
) -> ServiceProcess:
    return start_frontend(
        tmp_path, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace, args=args, wait=wait
    )


def test_sigterm_with_stuck_clients_and_hung_etcd_exits_within_grace(
    tmp_path, own_etcd, nats_url, namespace
):
    frontend = start_frontend(
        tmp_path, etcd_url=own_etcd.url, nats_url=nats_url, namespace=namespace,
        args=("--shutdown-grace", "2"), env={"LOG_FORMAT": "json"},
    )  # fmt: skip
    exits_within_grace_despite_stuck_clients_and_hung_etcd(
        frontend,
        own_etcd,
        grace_s=2,
        slow_path="/v1/chat/completions",
        stopping="frontend stopping",
    )


def test_connections_without_a_request_head_are_closed(tmp_path, etcd_url, nats_url, namespace):
    frontend = _frontend(tmp_path, etcd_url, nats_url, namespace, "--header-timeout-s", "1")
    try:
        silent = socket.create_connection(("127.0.0.1", frontend.port), timeout=20)
        half = socket.create_connection(("127.0.0.1", frontend.port), timeout=20)
        half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line: never complete
        assert closed_by_server(silent) and closed_by_server(half)
        served_after(frontend)  # complete requests are still answered
    finally:
        frontend.kill()


def test_sigterm_while_waiting_for_nats_exits_at_once(tmp_path, etcd_url, namespace):
    down = f"nats://127.0.0.1:{free_port()}"
    frontend = _frontend(tmp_path, etcd_url, down, namespace, wait=False)
    try:
        frontend.wait_for_log("waiting for NATS")
        code, took_s = stop_by_signal(frontend, grace_s=0)
    finally:
        frontend.kill()
    assert code == 0 and took_s < EXIT_MARGIN_S
    assert "frontend stopped during start-up" in frontend.log_path.read_text()


def test_a_request_uvicorn_cannot_parse_gets_a_json_400(tmp_path, etcd_url, nats_url, namespace):
    frontend = _frontend(tmp_path, etcd_url, nats_url, namespace)
    try:
        with socket.create_connection(("127.0.0.1", frontend.port), timeout=20) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")  # fmt: skip
            answer = b""
            while chunk := sock.recv(4096):  # to EOF: the connection closes
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ")
        assert b"content-type: application/json" in head
        error = json.loads(body)["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request")
    finally:
        frontend.kill()
