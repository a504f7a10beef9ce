"""A worker and etcd on two "hosts" (network namespaces), the link between them taken down.

The packets are dropped silently, as a failed switch would: no reset reaches either end.
The worker must say it lost its lease and re-publish on the heal (issue 27, case 1, with
a real partition rather than the proxy). Needs root; skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lorafleet.discovery.client import connect_etcd
from lorafleet.launch.local_servers import find_binary
from tests.netns import Netns
from tests.processes import start_worker

ETCD_PORT = 2379
TIMEOUT_S = 60


@pytest.fixture
def etcd_host(tmp_path: Path) -> Iterator[tuple[Netns, str]]:
    """etcd in a namespace of its own; yields its client URL (reached over the bridge)."""
    try:
        netns = Netns.create()
    except OSError as exc:
        pytest.skip(f"network namespaces need root and ip: {exc}")
    url = f"http://{netns.address}:{ETCD_PORT}"
    log = (tmp_path / "etcd.log").open("wb")
    etcd = subprocess.Popen(
        netns.argv(
            str(find_binary("etcd")), f"--data-dir={tmp_path / 'etcd'}",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            "--listen-peer-urls=http://127.0.0.1:2380", "--log-level=warn",
        ),
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not _healthy(url):
            assert etcd.poll() is None and time.monotonic() < deadline, "etcd did not start"
            time.sleep(0.1)
        yield netns, url
    finally:
        etcd.kill()
        etcd.wait()
        netns.delete()
        log.close()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as reply:
            return b"true" in reply.read()
    except OSError:
        return False


async def test_worker_on_the_far_side_of_a_down_link_says_so_and_republishes(
    etcd_host, tmp_path: Path, nats_url: str, namespace: str
) -> None:
    netns, etcd_url = etcd_host
    worker = await asyncio.to_thread(
        start_worker, tmp_path, etcd_url=etcd_url, nats_url=nats_url, namespace=namespace
    )
    try:
        async with httpx.AsyncClient(base_url=worker.url, timeout=10) as client:
            netns.cut()
            cut_at = time.monotonic()
            async with asyncio.timeout(TIMEOUT_S):
                while (health := await client.get("/health")).status_code != 503:
                    await asyncio.sleep(0.05)
            detect_s = time.monotonic() - cut_at
            assert health.json()["etcd"] == "lease expired"
            netns.heal()
            healed_at = time.monotonic()
            async with asyncio.timeout(TIMEOUT_S):
                while (await client.get("/health")).status_code != 200:
                    await asyncio.sleep(0.05)
            heal_s = time.monotonic() - healed_at
        etcd = await connect_etcd(etcd_url)
        keys = [kv.key for kv in await etcd.get_prefix(f"v1/instances/{namespace}/".encode())]
        await etcd.close()
        print(f"link down: detect {detect_s:.2f} s, heal {heal_s:.2f} s")
        assert len(keys) == 1  # the instance record is back
    finally:
        worker.kill()
