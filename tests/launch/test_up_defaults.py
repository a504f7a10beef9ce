"""``lorafleet up``'s laptop defaults: loopback only, ``file://`` inside the demo and cache
folders, and a start again on the same ports right after Ctrl-C.

Real processes: ``lorafleet up`` with the mocker engine (etcd, NATS, a frontend, a worker).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from lorafleet.launch.local_servers import free_port
from tests.launch.test_up_owns_its_cluster import _user_env, running_up
from tests.worker.adapters import make_adapter_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LISTEN_STATE = "0A"
LOOPBACK_HEX = "0100007F"


def _up(cwd: Path, http_port: int, system_port: int) -> AbstractContextManager[tuple[int, int]]:
    """``lorafleet up --engine mocker`` on these ports with no ``DYN_LORA_FILE_ROOTS`` of the
    user's: the defaults it sets itself are what these tests check."""
    env = {k: v for k, v in _user_env().items() if k != "DYN_LORA_FILE_ROOTS"}
    return running_up(cwd, ports=(http_port, system_port), env=env)


def _listen_addresses(port: int) -> set[str]:
    """The hex IPv4 addresses that listen on ``port`` (``/proc/net/tcp``)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    found = set()
    for row in rows:
        fields = row.split()
        address, hex_port = fields[1].split(":")
        if fields[3] == LISTEN_STATE and int(hex_port, 16) == port:
            found.add(address)
    return found


def test_up_listens_on_loopback_and_reads_files_only_from_its_folders(tmp_path: Path) -> None:
    http_port, system_port = free_port(), free_port()
    outside = make_adapter_dir(tmp_path / "elsewhere", "probe")
    with _up(tmp_path, http_port, system_port):
        listening = {port: _listen_addresses(port) for port in (http_port, system_port)}
        body = {"lora_name": "probe", "source": {"uri": f"file://{outside}"}}
        refused = httpx.post(f"http://127.0.0.1:{system_port}/engine/update/load_lora",
                             json=body, timeout=60)  # fmt: skip
    assert listening == {http_port: {LOOPBACK_HEX}, system_port: {LOOPBACK_HEX}}
    assert refused.status_code in (400, 403), refused.text
    assert "DYN_LORA_FILE_ROOTS" in refused.text


def test_up_starts_again_at_once_on_the_same_ports(tmp_path: Path) -> None:
    http_port, system_port = free_port(), free_port()
    client = httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=60)
    with client, _up(tmp_path, http_port, system_port):
        answer = client.post("/v1/completions", json={"model": "demo", "prompt": "hi"})
        assert answer.status_code == 200, answer.text
    # The server closed the kept-alive connection first: its side waits in TIME_WAIT.
    with _up(tmp_path, http_port, system_port):
        again = httpx.post(f"http://127.0.0.1:{http_port}/v1/completions",
                           json={"model": "demo", "prompt": "hi"}, timeout=60)  # fmt: skip
        assert again.status_code == 200, again.text
