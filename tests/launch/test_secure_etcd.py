"""``lorafleet up --secure``, etcd half: fresh certificates and passwords, etcd with TLS and auth.

The processes it starts reach etcd with the generated settings, strangers are refused,
and the secrets stay private to the user under the state directory.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from lorafleet.discovery.client import connect_etcd
from lorafleet.discovery.errors import EtcdRefusedError
from lorafleet.launch.cli import main as lorafleet
from lorafleet.launch.local_servers import free_port
from lorafleet.launch.secure_etcd import start_secure_etcd
from tests.launch.test_cluster import STOP_WAIT_S, _read_until_ready

pytestmark = pytest.mark.slow


async def test_secure_etcd_admits_its_settings_and_refuses_strangers(tmp_path: Path) -> None:
    secure = start_secure_etcd(tmp_path / "state", tmp_path / "servers", port=free_port())
    try:
        etcd = await connect_etcd(secure.settings)
        await etcd.put(b"v1/mdc/x", b"1")
        await etcd.close()
        with pytest.raises(EtcdRefusedError):  # TLS, but no client certificate or user
            await connect_etcd(f"https://127.0.0.1:{secure.server.port}")
    finally:
        secure.server.stop()
    secrets = [secure.root_password_path, secure.tls.client_key, secure.tls.server_key]
    assert all(path.stat().st_mode & 0o077 == 0 for path in secrets)
    assert (tmp_path / "state" / "secure").stat().st_mode & 0o077 == 0
    assert secure.settings.password not in repr(secure.settings)


async def test_up_secure_serves_through_an_etcd_with_tls_and_auth(tmp_path: Path) -> None:
    http_port = free_port()
    argv = [
        str(Path(sys.executable).parent / "lorafleet"), "up", "--secure", "--engine", "mocker",
        "--model", "demo", "--http-port", str(http_port), "--system-port", str(free_port()),
        "--state-dir", str(tmp_path / "state"),
    ]  # fmt: skip
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        lines = await asyncio.to_thread(_read_until_ready, up)
        endpoint = re.search(r"--endpoints (https://\S+)", "".join(lines))
        assert endpoint is not None, "".join(lines)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}") as client:
            models = (await client.get("/v1/models")).json()["data"]
        assert [model["id"] for model in models] == ["demo"]
        with pytest.raises(EtcdRefusedError, match="ETCD_AUTH_CA"):
            await connect_etcd(endpoint.group(1))
    finally:
        up.send_signal(signal.SIGINT)
        exit_code = await asyncio.to_thread(up.wait, STOP_WAIT_S)
    assert exit_code == 0


def test_lorafleet_lora_list_without_etcd_credentials_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secure = start_secure_etcd(tmp_path / "state", tmp_path / "servers", port=free_port())
    try:
        code = lorafleet(["lora", "list", "--etcd-endpoints", secure.server.url])
    finally:
        secure.server.stop()
    assert code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"etcd at {secure.server.url} refused connect" in line
    assert "ETCD_AUTH_CA" in line
